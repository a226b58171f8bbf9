// What specjax's CPU kernels share: 16-wide float vectors (AVX-512; two AVX2 vectors; or a
// portable fallback the compiler vectorizes) and the split of a call's work over XLA's intra-op
// thread pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "xla/ffi/api/ffi.h"

namespace specjax {

namespace ffi = xla::ffi;

#if defined(__AVX512F__)
using Vec = __m512;
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vbroadcast(const float* p) { return _mm512_set1_ps(*p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
inline float vsum(Vec v) { return _mm512_reduce_add_ps(v); }
inline float vhmax(Vec v) { return _mm512_reduce_max_ps(v); }
inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
inline void pause() { _mm_pause(); }
#elif defined(__AVX2__) && defined(__FMA__)
#define SPECJAX_AVX2 1
// AVX2 with FMA (e.g. AMD Zen 1-3, Intel before AVX-512): 16 floats as two 8-wide vectors,
// lane for lane the same operations as the AVX-512 path.
struct Vec { __m256 lo, hi; };
inline Vec vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Vec vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline Vec vbroadcast(const float* p) { const __m256 b = _mm256_broadcast_ss(p); return {b, b}; }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
inline Vec vfma(Vec a, Vec b, Vec c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline Vec vadd(Vec a, Vec b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline Vec vsub(Vec a, Vec b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline Vec vmul(Vec a, Vec b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline Vec vmax(Vec a, Vec b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
// the 8 lanes of v summed (or maxed) pairwise
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float vsum(Vec v) { return hsum8(_mm256_add_ps(v.lo, v.hi)); }
inline float vhmax(Vec v) {
  __m256 m8 = _mm256_max_ps(v.lo, v.hi);
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
inline void pause() { _mm_pause(); }
#else
// Portable path: the same arithmetic on 16-wide arrays (the compiler vectorizes the loops).
struct Vec { float v[16]; };
inline Vec vzero() { Vec r; for (int i = 0; i < 16; ++i) r.v[i] = 0.f; return r; }
inline Vec vload(const float* p) { Vec r; std::memcpy(r.v, p, sizeof(r.v)); return r; }
inline Vec vbroadcast(const float* p) { Vec r; for (int i = 0; i < 16; ++i) r.v[i] = *p; return r; }
inline void vstore(float* p, Vec v) { std::memcpy(p, v.v, sizeof(v.v)); }
inline Vec vfma(Vec a, Vec b, Vec c) {
  Vec r;
  for (int i = 0; i < 16; ++i) r.v[i] = __builtin_fmaf(a.v[i], b.v[i], c.v[i]);
  return r;
}
template <class Op>
inline Vec vmap(Vec a, Vec b, Op op) {
  Vec r;
  for (int i = 0; i < 16; ++i) r.v[i] = op(a.v[i], b.v[i]);
  return r;
}
inline Vec vadd(Vec a, Vec b) { return vmap(a, b, [](float x, float y) { return x + y; }); }
inline Vec vsub(Vec a, Vec b) { return vmap(a, b, [](float x, float y) { return x - y; }); }
inline Vec vmul(Vec a, Vec b) { return vmap(a, b, [](float x, float y) { return x * y; }); }
inline Vec vmax(Vec a, Vec b) { return vmap(a, b, [](float x, float y) { return x > y ? x : y; }); }
inline float vsum(Vec v) { float s = 0.f; for (int i = 0; i < 16; ++i) s += v.v[i]; return s; }
inline float vhmax(Vec v) { float m = v.v[0]; for (int i = 1; i < 16; ++i) m = m > v.v[i] ? m : v.v[i]; return m; }
inline void prefetch(const void*) {}
inline void pause() {}
#endif

// Units of work are claimed from a shared counter by the caller and by pool tasks. Nobody waits
// for a task to start (XLA may run several kernel calls at once on the same pool): the caller
// waits only for units already claimed, which are running. `fn(u)` does unit u.
struct Work {
  std::atomic<int64_t> next{0}, done{0};
  int64_t units = 0;
};

template <class Fn>
void parallel(ffi::ThreadPool& pool, int64_t units, bool use_threads, Fn fn) {
  auto work = std::make_shared<Work>();
  work->units = units;
  auto body = [fn](Work& state) {
    for (int64_t u; (u = state.next.fetch_add(1)) < state.units;) {
      fn(u);
      state.done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = use_threads ? std::min<int64_t>(pool.num_threads(), units) - 1 : 0;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([work, body] { body(*work); });
  body(*work);
  while (work->done.load(std::memory_order_acquire) < work->units) pause();
}

}  // namespace specjax
