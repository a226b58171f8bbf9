// specjax's CPU kernels for decoding: the matrix product y[M, N] = x[M, K] . W[K, N] with few
// rows M (a decode step, a verify window) and weights stored f32, bf16, or in llama.cpp's
// 32-weight blocks (8-bit or 4-bit codes q with a scale d and an offset m per block of 32
// inputs: w = d * q + m). Attention of those rows over a KV cache is in cpu_attention.cc.
//
// Why: XLA's CPU dot streams f32 weights at memory bandwidth for one row, but 2-8 rows cost
// 1.6-2.5x one row, and it converts bf16 or int8 weights to f32 in memory before a one-row
// dot. Here every weight is read from memory once per call and dequantized in registers.
//
// Layout ("panels", as GEMM libraries pack their B matrix): the outputs in groups of 32, each
// group's weights stored input by input, [N / 32][K][32], so that one register block walks
// one or two contiguous streams; the block formats keep their (d, m) as [N / 32][K / 32][2][32].
// A 4-bit panel row is 16 bytes: the low nibbles are outputs 0-15, the high ones 16-31.
//
// x[m, k] is broadcast and multiplied into vectors of 16 outputs, so each (row, output) sum
// runs over k in order, in its own accumulator lane, with fused multiply-adds: a row's result
// does not depend on M or on the other rows in the call. A verify pass over K+1 positions is
// bit-identical to K+1 one-token passes, and greedy speculative decoding equals AR exactly.
//
// Vector paths: AVX-512, AVX2 with FMA (8-wide, tiled for its 16 registers), and a portable
// one the compiler vectorizes; all compute the same sums in the same order.
//
// Built by specjax/kernels/cpu.py with the host compiler (-O3 -march=native) and called
// through XLA's FFI (jax.ffi), with work split over XLA's intra-op thread pool.
#include "cpu_common.h"

namespace specjax {
namespace {

constexpr int kF32 = 0, kBF16 = 1, kQ8 = 2, kQ4 = 3;
constexpr int64_t kGroup = 32;  // outputs per panel; also inputs per (d, m) block
#ifndef SPECJAX_PREFETCH
#define SPECJAX_PREFETCH 8192
#endif
constexpr int64_t kPrefetch = SPECJAX_PREFETCH;  // bytes ahead of each panel's weight stream
constexpr int64_t kCopyRows = 32;  // rows from which block codes are dequantized once (outputs)

// bytes of one input's 32 outputs in a panel
template <int FMT>
constexpr int64_t kRowBytes = FMT == kF32 ? 128 : FMT == kBF16 ? 64 : FMT == kQ8 ? 32 : 16;

struct Weights {
  const uint8_t* data;
  const float* scales;  // [N / 32][K / 32][2][32] for the block formats
  int64_t K;
};

#if defined(__AVX512F__)
// The 32 weights of one input row of a panel, outputs 0-15 in lo and 16-31 in hi; d and m are
// the panel's (scale, offset) vectors for this input's block.
template <int FMT>
inline void load_row(const uint8_t* row, const Vec* dm, Vec& lo, Vec& hi) {
  if constexpr (FMT == kF32) {
    lo = _mm512_loadu_ps(reinterpret_cast<const float*>(row));
    hi = _mm512_loadu_ps(reinterpret_cast<const float*>(row) + 16);
  } else if constexpr (FMT == kBF16) {  // bf16 -> f32 is the 16 bits moved up
    __m512i v = _mm512_loadu_si512(row);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
    hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
  } else if constexpr (FMT == kQ8) {
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)))), dm[0], dm[2]);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16)))), dm[1], dm[3]);
  } else {
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
    lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, _mm512_set1_epi32(15))), dm[0], dm[2]);
    hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), dm[1], dm[3]);
  }
}
#elif defined(SPECJAX_AVX2)
// Weights q*8 .. q*8 + 7 of one input row of a panel (q = 0..3), with d and m their (scale,
// offset) vectors: the same values as the AVX-512 path, 8 at a time.
template <int FMT>
inline __m256 load8(const uint8_t* row, __m256 d, __m256 m, int q) {
  if constexpr (FMT == kF32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + 8 * q);
  } else if constexpr (FMT == kBF16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * q));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
  } else if constexpr (FMT == kQ8) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * q));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), d, m);
  } else {  // outputs 0-15 are the low nibbles of bytes 0-15, outputs 16-31 the high ones
    __m256i v = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8 * (q & 1))));
    v = q < 2 ? _mm256_and_si256(v, _mm256_set1_epi32(15)) : _mm256_srli_epi32(v, 4);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), d, m);
  }
}
template <int FMT>
inline void load_row(const uint8_t* row, const Vec* dm, Vec& lo, Vec& hi) {
  lo = {load8<FMT>(row, dm[0].lo, dm[2].lo, 0), load8<FMT>(row, dm[0].hi, dm[2].hi, 1)};
  hi = {load8<FMT>(row, dm[1].lo, dm[3].lo, 2), load8<FMT>(row, dm[1].hi, dm[3].hi, 3)};
}
#else
template <int FMT>
inline void load_row(const uint8_t* row, const Vec* dm, Vec& lo, Vec& hi) {
  float w[32];
  for (int i = 0; i < 32; ++i) {
    if constexpr (FMT == kF32) {
      std::memcpy(&w[i], row + 4 * i, 4);
    } else if constexpr (FMT == kBF16) {
      uint32_t bits = uint32_t(row[2 * i] | (row[2 * i + 1] << 8)) << 16;
      std::memcpy(&w[i], &bits, 4);
    } else {
      float q = FMT == kQ8 ? float(int8_t(row[i])) : float(i < 16 ? row[i] & 15 : row[i - 16] >> 4);
      w[i] = __builtin_fmaf(q, dm[i / 16].v[i % 16], dm[2 + i / 16].v[i % 16]);
    }
  }
  std::memcpy(lo.v, w, 64);
  std::memcpy(hi.v, w + 16, 64);
}
#endif

#if defined(SPECJAX_AVX2)
// AVX2 has 16 vector registers: the MT rows' accumulators for NQ of a panel's 4 vectors of 8
// outputs must fit, so more rows take fewer outputs at a time and walk the panel in 4 / NQ
// passes (the later ones read it from cache). Each (row, output) sum still runs over k in
// order in its own lane, with the same fused multiply-adds as the other paths.
// Outputs Q0 * 8 .. (Q0 + NQ) * 8 - 1 of a panel over the inputs [kb, ke), from 0 (kb = 0) or
// from the partial sums the previous inputs left in y (an exact store and reload).
template <int FMT, int MT, int NQ, int Q0>
__attribute__((always_inline)) inline void pass(const Weights& w, const float* x, int64_t ldx,
                                                float* y, int64_t N, int64_t panel, int64_t kb,
                                                int64_t ke) {
  const int64_t K = w.K;
  const uint8_t* rows = w.data + panel * K * kRowBytes<FMT>;
  float* out = y + panel * kGroup + 8 * Q0;
  __m256 acc[MT][NQ];
#pragma GCC unroll 16
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int j = 0; j < NQ; ++j)
      acc[m][j] = kb == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out + m * N + 8 * j);
#pragma GCC unroll 1
  for (int64_t k0 = kb; k0 < ke; k0 += kGroup) {
    __m256 d[NQ], o[NQ];  // scale and offset of this block's outputs
#pragma GCC unroll 4
    for (int j = 0; j < NQ; ++j) {
      if constexpr (FMT >= kQ8) {
        const float* s = w.scales + (panel * (K / kGroup) + k0 / kGroup) * 2 * kGroup;
        d[j] = _mm256_loadu_ps(s + 8 * (Q0 + j));
        o[j] = _mm256_loadu_ps(s + kGroup + 8 * (Q0 + j));
      } else {
        d[j] = o[j] = _mm256_setzero_ps();
      }
    }
#pragma GCC unroll 2
    for (int64_t k = k0; k < k0 + kGroup; ++k) {
      const uint8_t* row = rows + k * kRowBytes<FMT>;
      if constexpr (Q0 == 0) {  // the first pass streams the panel: a prefetch per 64-byte line
        if ((k * kRowBytes<FMT>) % 64 == 0) prefetch(row + kPrefetch);
        if (kRowBytes<FMT> > 64) prefetch(row + 64 + kPrefetch);
      }
      __m256 wt[NQ];
#pragma GCC unroll 4
      for (int j = 0; j < NQ; ++j) wt[j] = load8<FMT>(row, d[j], o[j], Q0 + j);
#pragma GCC unroll 16
      for (int m = 0; m < MT; ++m) {
        const __m256 xb = _mm256_broadcast_ss(x + m * ldx + k);
#pragma GCC unroll 4
        for (int j = 0; j < NQ; ++j) acc[m][j] = _mm256_fmadd_ps(xb, wt[j], acc[m][j]);
      }
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < MT; ++m)
#pragma GCC unroll 4
    for (int j = 0; j < NQ; ++j) _mm256_storeu_ps(out + m * N + 8 * j, acc[m][j]);
}

// Several passes walk the panel in chunks of inputs small enough (4 KB of weights) that the
// later passes read the chunk from L1.
template <int FMT, int MT, int NQ>
inline void block(const Weights& w, const float* x, int64_t ldx, float* y, int64_t N,
                  int64_t panel) {
  constexpr int64_t chunk = NQ == 4 ? int64_t(1) << 40
                                    : std::max<int64_t>(kGroup, 4096 / kRowBytes<FMT>);
  for (int64_t kb = 0; kb < w.K; kb += chunk) {
    const int64_t ke = std::min(w.K, kb + chunk);
    pass<FMT, MT, NQ, 0>(w, x, ldx, y, N, panel, kb, ke);
    if constexpr (NQ <= 2) pass<FMT, MT, NQ, NQ>(w, x, ldx, y, N, panel, kb, ke);
    if constexpr (NQ == 1) {
      pass<FMT, MT, NQ, 2>(w, x, ldx, y, N, panel, kb, ke);
      pass<FMT, MT, NQ, 3>(w, x, ldx, y, N, panel, kb, ke);
    }
  }
}

template <int FMT, int MT>
void rows_block(const Weights& w, const float* x, int64_t ldx, float* y, int64_t N, int64_t p0,
                int64_t p1) {
  constexpr int NQ = MT <= 2 ? 4 : MT <= 5 ? 2 : 1;
  for (int64_t p = p0; p < p1; ++p) block<FMT, MT, NQ>(w, x, ldx, y, N, p);
}
#else
// MT rows of x against NP panels from `panel` (32 * NP outputs): acc[m][2p + h] holds outputs
// 32p + 16h .. + 15 of row m, summed over k in order.
template <int FMT, int MT, int NP>
inline void block(const Weights& w, const float* x, int64_t ldx, float* y, int64_t N,
                  int64_t panel) {
  const int64_t K = w.K;
  const uint8_t* rows[NP];
  for (int p = 0; p < NP; ++p) rows[p] = w.data + (panel + p) * K * kRowBytes<FMT>;
  Vec acc[MT][2 * NP];
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < 2 * NP; ++r) acc[m][r] = vzero();
  for (int64_t k0 = 0; k0 < K; k0 += kGroup) {
    Vec dm[NP][4];  // d_lo, d_hi, m_lo, m_hi of this block
    if constexpr (FMT >= kQ8) {
      for (int p = 0; p < NP; ++p) {
        const float* s = w.scales + ((panel + p) * (K / kGroup) + k0 / kGroup) * 2 * kGroup;
        dm[p][0] = vload(s); dm[p][1] = vload(s + 16);
        dm[p][2] = vload(s + 32); dm[p][3] = vload(s + 48);
      }
    }
    for (int64_t k = k0; k < k0 + kGroup; ++k) {
      Vec wt[2 * NP];
      for (int p = 0; p < NP; ++p) {
        const uint8_t* row = rows[p] + k * kRowBytes<FMT>;
        // one prefetch per 64-byte line of the stream, kPrefetch bytes ahead
        if ((k * kRowBytes<FMT>) % 64 == 0) prefetch(row + kPrefetch);
        if (kRowBytes<FMT> > 64) prefetch(row + 64 + kPrefetch);
        load_row<FMT>(row, dm[p], wt[2 * p], wt[2 * p + 1]);
      }
      for (int m = 0; m < MT; ++m) {
        Vec xb = vbroadcast(x + m * ldx + k);
        for (int r = 0; r < 2 * NP; ++r) acc[m][r] = vfma(xb, wt[r], acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int r = 0; r < 2 * NP; ++r) vstore(y + m * N + panel * kGroup + 16 * r, acc[m][r]);
}

template <int FMT, int MT>
void rows_block(const Weights& w, const float* x, int64_t ldx, float* y, int64_t N, int64_t p0,
                int64_t p1) {
  constexpr int NP = MT <= 4 ? 2 : 1;
  int64_t p = p0;
  for (; p + NP <= p1; p += NP) block<FMT, MT, NP>(w, x, ldx, y, N, p);
  for (; p < p1; ++p) block<FMT, MT, 1>(w, x, ldx, y, N, p);
}
#endif

// Rows in groups of up to 8 (12 over float32 weights for a prefill: more rows per weight
// loaded; a row's operations are the same in any group).
template <int FMT>
void row_groups(const Weights& w, const float* x, int64_t M, float* y, int64_t N, int64_t p0,
                int64_t p1) {
  const int64_t K = w.K, group = FMT == kF32 && M >= kCopyRows ? 12 : 8;
  for (int64_t m0 = 0; m0 < M; m0 += group) {
    const float* xm = x + m0 * K;
    float* ym = y + m0 * N;
    switch (std::min<int64_t>(group, M - m0)) {
      case 1: rows_block<FMT, 1>(w, xm, K, ym, N, p0, p1); break;
      case 2: rows_block<FMT, 2>(w, xm, K, ym, N, p0, p1); break;
      case 3: rows_block<FMT, 3>(w, xm, K, ym, N, p0, p1); break;
      case 4: rows_block<FMT, 4>(w, xm, K, ym, N, p0, p1); break;
      case 5: rows_block<FMT, 5>(w, xm, K, ym, N, p0, p1); break;
      case 6: rows_block<FMT, 6>(w, xm, K, ym, N, p0, p1); break;
      case 7: rows_block<FMT, 7>(w, xm, K, ym, N, p0, p1); break;
      case 8: rows_block<FMT, 8>(w, xm, K, ym, N, p0, p1); break;
      case 9: rows_block<FMT, 9>(w, xm, K, ym, N, p0, p1); break;
      case 10: rows_block<FMT, 10>(w, xm, K, ym, N, p0, p1); break;
      case 11: rows_block<FMT, 11>(w, xm, K, ym, N, p0, p1); break;
      default: rows_block<FMT, 12>(w, xm, K, ym, N, p0, p1); break;
    }
  }
}

// Panels [p0, p1) for all M rows, in groups of up to 8 rows. From 32 rows on (a prefill), the
// panels are first dequantized once into a cache-resident float32 copy, holding exactly the
// values the register path computes, and every group of rows runs over that (for fewer rows,
// writing and rereading the copy costs more than dequantizing in registers again).
template <int FMT>
void outputs(const Weights& w, const float* x, int64_t M, float* y, int64_t N, int64_t p0,
             int64_t p1) {
  if (FMT == kF32 || M < kCopyRows) return row_groups<FMT>(w, x, M, y, N, p0, p1);
  const int64_t K = w.K;
  thread_local std::vector<float> copy;
  copy.resize((p1 - p0) * K * kGroup);
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* rows = w.data + p * K * kRowBytes<FMT>;
    float* out = copy.data() + (p - p0) * K * kGroup;
    for (int64_t k0 = 0; k0 < K; k0 += kGroup) {
      Vec dm[4];
      if constexpr (FMT >= kQ8) {
        const float* s = w.scales + (p * (K / kGroup) + k0 / kGroup) * 2 * kGroup;
        for (int i = 0; i < 4; ++i) dm[i] = vload(s + 16 * i);
      }
      for (int64_t k = k0; k < k0 + kGroup; ++k) {
        Vec lo, hi;
        load_row<FMT>(rows + k * kRowBytes<FMT>, dm, lo, hi);
        vstore(out + k * kGroup, lo);
        vstore(out + k * kGroup + 16, hi);
      }
    }
  }
  const Weights f32{reinterpret_cast<const uint8_t*>(copy.data()), nullptr, K};
  row_groups<kF32>(f32, x, M, y + p0 * kGroup, N, 0, p1 - p0);  // panel 0 of the copy is p0
}

template <int FMT>
void run(ffi::ThreadPool& pool, const Weights& w, const float* x, int64_t M, float* y,
         int64_t N) {
  constexpr int64_t kUnit = 2;  // panels per unit of work
  const int64_t panels = N / kGroup;
  const bool threads = N * w.K * M >= (1 << 16);  // a small product does not pay for a wake-up
  parallel(pool, (panels + kUnit - 1) / kUnit, threads, [&, panels](int64_t u) {
    outputs<FMT>(w, x, M, y, N, u * kUnit, std::min(panels, (u + 1) * kUnit));
  });
}

template <int FMT>
ffi::Error Matmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer data,
                  ffi::Buffer<ffi::F32> scales, ffi::ResultBuffer<ffi::F32> y) {
  auto dims = data.dimensions();
  if (dims.size() != 3) return ffi::Error::InvalidArgument("weights must be [N / 32, K, row]");
  const int64_t K = x.dimensions().back(), M = x.element_count() / K, N = dims[0] * kGroup;
  const int64_t row_bytes = kRowBytes<FMT>;
  if (K % kGroup != 0 || dims[1] != K || int64_t(data.size_bytes()) != N / kGroup * K * row_bytes)
    return ffi::Error::InvalidArgument("weights do not match x's inner dimension");
  if (FMT >= kQ8 && int64_t(scales.element_count()) != 2 * N * (K / kGroup))
    return ffi::Error::InvalidArgument("scales must be [N / 32, K / 32, 2, 32]");
  if (int64_t(y->element_count()) != M * N)
    return ffi::Error::InvalidArgument("the output must be [M, N]");
  Weights w{static_cast<const uint8_t*>(data.untyped_data()), scales.typed_data(), K};
  run<FMT>(pool, w, x.typed_data(), M, y->typed_data(), N);
  return ffi::Error::Success();
}


}  // namespace
}  // namespace specjax

#define SPECJAX_MATMUL(name, FMT)                                                   \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name, specjax::Matmul<FMT>,                         \
                                specjax::ffi::Ffi::Bind()                           \
                                    .Ctx<specjax::ffi::ThreadPool>()                \
                                    .Arg<specjax::ffi::Buffer<specjax::ffi::F32>>() \
                                    .Arg<specjax::ffi::AnyBuffer>()                 \
                                    .Arg<specjax::ffi::Buffer<specjax::ffi::F32>>() \
                                    .Ret<specjax::ffi::Buffer<specjax::ffi::F32>>());

SPECJAX_MATMUL(specjax_matmul_f32, specjax::kF32)
SPECJAX_MATMUL(specjax_matmul_bf16, specjax::kBF16)
SPECJAX_MATMUL(specjax_matmul_q8, specjax::kQ8)
SPECJAX_MATMUL(specjax_matmul_q4, specjax::kQ4)
