// specjax's CPU attention for decoding: a few new positions per row over a KV cache.
#include <cmath>

#include "cpu_common.h"

namespace specjax {
namespace {

// ---------------------------------------------------------------------------------------------
// Attention of a few new positions over a KV cache: out[b, t, n] = sum_s p_s v[b, s, n / G]
// with p = softmax(q[b, t, n] . k[b, s, n / G] / sqrt(H)) over the slots s <= limit[b, t]. Only
// those slots are read, so a step's cost follows its context, and each query's result depends
// on nothing but its own inputs (the same for any T or batch).

#if defined(__AVX512F__)
// e^x for x <= 0 (Cephes' expf polynomial after x = n ln 2 + r; about 1 ulp).
inline __m512 vexp(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-103.f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}
inline void exp_inplace(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, vexp(_mm512_loadu_ps(x + i)));
  if (i < n) {
    __mmask16 m = __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, m, vexp(_mm512_maskz_loadu_ps(m, x + i)));
  }
}
// Lane i of the result: the sum of the 16 lanes of v[i] (a transpose-and-add tree: 45 shuffles
// and adds for 16 sums, where 16 separate reductions take about 130).
inline __m512 sum16(const __m512* v) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {
    __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // each 128-bit lane L of u[i] now holds lane L's sums of v[4i .. 4i + 3]
  __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                             _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
  __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88),
                             _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, 0x88), _mm512_shuffle_f32x4(s01, s23, 0xdd));
}

// q . k for the keys s0 .. s0 + n - 1 (n <= 16; the rest of the lanes 0).
inline void scores16(const float* q, const float* k, int64_t stride, int64_t h, int64_t n,
                     float* out) {
  __m512 prod[16];
  for (int64_t j = 0; j < 16; ++j) {
    prod[j] = _mm512_setzero_ps();
    if (j < n)
      for (int64_t i = 0; i < h; i += 16)
        prod[j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k + j * stride + i),
                                  prod[j]);
  }
  _mm512_storeu_ps(out, sum16(prod));
}
#elif defined(SPECJAX_AVX2)
// e^x for x <= 0, as the AVX-512 path (Cephes' polynomial), 8 lanes at a time; 2^n is built
// in the exponent bits, so below x = -87 (e^-87 = 1.6e-38) the result is 0.
inline __m256 vexp8(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.f), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n),
                                                       _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
inline void exp_inplace(float* x, int64_t n) {  // n is a multiple of 16 (softmax's width)
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(x + i, vexp8(_mm256_loadu_ps(x + i)));
}
// q . k for the keys s0 .. s0 + n - 1 (n <= 16; the rest of the lanes 0).
inline void scores16(const float* q, const float* k, int64_t stride, int64_t h, int64_t n,
                     float* out) {
  for (int64_t j = 0; j < 16; ++j) {
    __m256 acc = _mm256_setzero_ps();
    if (j < n)
      for (int64_t i = 0; i < h; i += 8)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(k + j * stride + i), acc);
    out[j] = hsum8(acc);
  }
}
#else
inline void exp_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = __builtin_expf(x[i]);
}
inline void scores16(const float* q, const float* k, int64_t stride, int64_t h, int64_t n,
                     float* out) {
  for (int64_t j = 0; j < 16; ++j) {
    float acc[16] = {};
    if (j < n)
      for (int64_t i = 0; i < h; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] = __builtin_fmaf(q[i + l], k[j * stride + i + l], acc[l]);
    float sum = 0.f;
    for (int l = 0; l < 16; ++l) sum += acc[l];
    out[j] = sum;
  }
}
#endif

struct AttentionShape {
  int64_t B, T, N, H, S, KV;
};

// Softmax of scale * scores[0 .. keys) in place, over 16-wide chunks; the lanes past `keys`
// (up to the next multiple of 16) end as 0.
void softmax(float* p, int64_t keys, float scale) {
  const int64_t width = (keys + 15) / 16 * 16;
  const Vec vscale = vbroadcast(&scale);
  for (int64_t s = 0; s < width; s += 16) vstore(p + s, vmul(vload(p + s), vscale));
  for (int64_t s = keys; s < width; ++s) p[s] = -__builtin_inff();
  Vec top = vload(p);
  for (int64_t s = 16; s < width; s += 16) top = vmax(top, vload(p + s));
  const float m = vhmax(top);
  const Vec vm = vbroadcast(&m);
  for (int64_t s = 0; s < width; s += 16) vstore(p + s, vsub(vload(p + s), vm));
  exp_inplace(p, width);
  Vec total = vzero();
  for (int64_t s = 0; s < width; s += 16) total = vadd(total, vload(p + s));
  const float inv = 1.f / vsum(total);
  const Vec vinv = vbroadcast(&inv);
  for (int64_t s = 0; s < width; s += 16) vstore(p + s, vmul(vload(p + s), vinv));
}

// out[0 .. 16 HV) = sum over keys of p[s] * v[s * stride ..]: HV independent accumulators,
// keys in order.
template <int HV>
void weighted_values(const float* p, const float* v, int64_t stride, int64_t keys, float* out) {
  Vec acc[HV];
  for (int i = 0; i < HV; ++i) acc[i] = vzero();
  for (int64_t s = 0; s < keys; ++s) {
    const Vec ps = vbroadcast(p + s);
    for (int i = 0; i < HV; ++i) acc[i] = vfma(ps, vload(v + s * stride + 16 * i), acc[i]);
  }
  for (int i = 0; i < HV; ++i) vstore(out + 16 * i, acc[i]);
}

// The G query heads that share one KV head: scores into `p` (scratch of G x S rounded up to
// 16), softmax, weighted sum of values. Keys are read once for all G heads.
void attend_group(const AttentionShape& a, const float* q, const float* k, const float* v,
                  int64_t keys, int64_t groups, float* p, float* out) {
  const float scale = 1.f / __builtin_sqrtf(float(a.H));
  const int64_t stride = a.KV * a.H;  // between consecutive slots of one head
  const int64_t width = (keys + 15) / 16 * 16;
  for (int64_t s0 = 0; s0 < keys; s0 += 16)
    for (int64_t g = 0; g < groups; ++g)
      scores16(q + g * a.H, k + s0 * stride, stride, a.H, std::min<int64_t>(16, keys - s0),
               p + g * width + s0);
  for (int64_t g = 0; g < groups; ++g) {
    float* pg = p + g * width;
    softmax(pg, keys, scale);
    float* o = out + g * a.H;
    switch (a.H / 16) {
      case 1: weighted_values<1>(pg, v, stride, keys, o); break;
      case 2: weighted_values<2>(pg, v, stride, keys, o); break;
      case 4: weighted_values<4>(pg, v, stride, keys, o); break;
      case 8: weighted_values<8>(pg, v, stride, keys, o); break;
      default:
        for (int64_t h = 0; h < a.H; h += 16) weighted_values<1>(pg, v + h, stride, keys, o + h);
    }
  }
}

ffi::Error Attention(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> k,
                     ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::S32> limit,
                     ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions(), kd = k.dimensions();
  if (qd.size() != 4 || kd.size() != 4 || qd[0] != kd[0] || qd[3] != kd[3] || qd[2] % kd[2] ||
      qd[3] % 16 || k.element_count() != v.element_count() ||
      int64_t(limit.element_count()) != qd[0] * qd[1])
    return ffi::Error::InvalidArgument("attention: q [B,T,N,H], k, v [B,S,KV,H], limit [B,T]");
  AttentionShape a{qd[0], qd[1], qd[2], qd[3], kd[1], kd[2]};
  const float *qp = q.typed_data(), *kp = k.typed_data(), *vp = v.typed_data();
  const int32_t* lp = limit.typed_data();
  float* op = out->typed_data();
  const int64_t groups = a.N / a.KV;  // query heads per KV head
  const int64_t reads = a.B * a.T * a.KV * a.S * a.H;  // an upper bound on the work
  parallel(pool, a.B * a.T * a.KV, reads >= (1 << 17), [&](int64_t u) {
    thread_local std::vector<float> p;
    const int64_t width = (a.S + 15) / 16 * 16;
    if (int64_t(p.size()) < groups * width) p.resize(groups * width);
    const int64_t head = u % a.KV, bt = u / a.KV, b = bt / a.T;
    const int64_t keys = std::min<int64_t>(a.S, std::max<int32_t>(lp[bt], -1) + 1);
    const int64_t first = bt * a.N + head * groups;  // the group's first query head
    float* o = op + first * a.H;
    if (keys == 0) {
      std::fill(o, o + groups * a.H, 0.f);
      return;
    }
    attend_group(a, qp + first * a.H, kp + (b * a.S * a.KV + head) * a.H,
                 vp + (b * a.S * a.KV + head) * a.H, keys, groups, p.data(), o);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace specjax

XLA_FFI_DEFINE_HANDLER_SYMBOL(specjax_attention, specjax::Attention,
                              specjax::ffi::Ffi::Bind()
                                  .Ctx<specjax::ffi::ThreadPool>()
                                  .Arg<specjax::ffi::Buffer<specjax::ffi::F32>>()
                                  .Arg<specjax::ffi::Buffer<specjax::ffi::F32>>()
                                  .Arg<specjax::ffi::Buffer<specjax::ffi::F32>>()
                                  .Arg<specjax::ffi::Buffer<specjax::ffi::S32>>()
                                  .Ret<specjax::ffi::Buffer<specjax::ffi::F32>>());
