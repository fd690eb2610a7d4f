#include "backends/engine/attention_kernels.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <limits>

namespace rlforge::backends::kernels {

namespace {

// Fortran BLAS (LP64): column-major, arguments by pointer.
using sgemm_fn = void (*)(const char*, const char*, const int*, const int*, const int*,
                          const float*, const float*, const int*, const float*, const int*,
                          const float*, float*, const int*);

sgemm_fn blas() {
  // libtorch links the system BLAS (libblas.so.3), so `sgemm_` is in the global scope.
  static const sgemm_fn fn = reinterpret_cast<sgemm_fn>(::dlsym(RTLD_DEFAULT, "sgemm_"));
  return fn;
}

// OpenBLAS's small-matrix kernels beat the loops below even for a decoding sequence's two query
// rows against 16 keys (measured here: 2-5x for scores and values alike), so the loops only
// serve when no BLAS `sgemm_` is loaded.
bool loops_forced = false;

bool use_blas(int64_t m, int64_t n) {
  return !loops_forced && blas() != nullptr && m < std::numeric_limits<int>::max() &&
         n < std::numeric_limits<int>::max();
}

// Eight independent partial sums: the fixed-size inner loops vectorise (one ymm register in
// the AVX2 clones) without reassociating a single running sum.
inline float dot(const float* a, const float* b, int64_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int l = 0; l < 8; ++l)
      acc[l] += a[i + l] * b[i + l];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < d; ++i)
    s += a[i] * b[i];
  return s;
}

// The same for a length that is a multiple of 8 known at compile time.
template <int64_t D> inline float dot_fixed(const float* a, const float* b) {
  static_assert(D % 8 == 0, "dot_fixed needs a multiple of 8");
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < D; i += 8)
    for (int l = 0; l < 8; ++l)
      acc[l] += a[i + l] * b[i + l];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

inline void axpy(float* y, const float* x, float a, int64_t d) {
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int l = 0; l < 8; ++l)
      y[i + l] += a * x[i + l];
  for (; i < d; ++i)
    y[i] += a * x[i];
}

// Head dimensions known at compile time keep a query row (or an output row) in registers
// across keys; others take the generic loops.
template <int64_t D>
inline void scores_fixed(const float* q, int64_t m, const float* k, int64_t n, float* out,
                         int64_t ldo) {
  for (int64_t r = 0; r < m; ++r) {
    float qr[D];
    for (int64_t i = 0; i < D; ++i)
      qr[i] = q[r * D + i];
    float* orow = out + r * ldo;
    for (int64_t t = 0; t < n; ++t)
      orow[t] = dot_fixed<D>(qr, k + t * D);
  }
}

template <int64_t D>
inline void accumulate_fixed(const float* p, int64_t m, int64_t ldp, const float* v, int64_t n,
                             float* o) {
  for (int64_t r = 0; r < m; ++r) {
    float acc[D];
    for (int64_t i = 0; i < D; ++i)
      acc[i] = o[r * D + i];
    const float* prow = p + r * ldp;
    for (int64_t t = 0; t < n; ++t) {
      const float a = prow[t];
      const float* vt = v + t * D;
      for (int64_t i = 0; i < D; ++i)
        acc[i] += a * vt[i];
    }
    for (int64_t i = 0; i < D; ++i)
      o[r * D + i] = acc[i];
  }
}

__attribute__((target_clones("avx2", "default"))) void
scores_loops(const float* q, int64_t m, const float* k, int64_t n, int64_t d, float* out,
             int64_t ldo) {
  switch (d) {
  case 16:
    return scores_fixed<16>(q, m, k, n, out, ldo);
  case 32:
    return scores_fixed<32>(q, m, k, n, out, ldo);
  case 64:
    return scores_fixed<64>(q, m, k, n, out, ldo);
  case 128:
    return scores_fixed<128>(q, m, k, n, out, ldo);
  default:
    break;
  }
  for (int64_t t = 0; t < n; ++t) {
    const float* kt = k + t * d;
    for (int64_t r = 0; r < m; ++r)
      out[r * ldo + t] = dot(q + r * d, kt, d);
  }
}

__attribute__((target_clones("avx2", "default"))) void
accumulate_loops(const float* p, int64_t m, int64_t ldp, const float* v, int64_t n, int64_t d,
                 float* o) {
  switch (d) {
  case 16:
    return accumulate_fixed<16>(p, m, ldp, v, n, o);
  case 32:
    return accumulate_fixed<32>(p, m, ldp, v, n, o);
  case 64:
    return accumulate_fixed<64>(p, m, ldp, v, n, o);
  case 128:
    return accumulate_fixed<128>(p, m, ldp, v, n, o);
  default:
    break;
  }
  for (int64_t r = 0; r < m; ++r) {
    float* orow = o + r * d;
    const float* prow = p + r * ldp;
    for (int64_t t = 0; t < n; ++t)
      axpy(orow, v + t * d, prow[t], d);
  }
}

} // namespace

bool have_blas() {
  return blas() != nullptr;
}

void force_loops(bool on) {
  loops_forced = on;
}

void scores(const float* q, int64_t m, const float* k, int64_t n, int64_t d, float* out,
            int64_t ldo) {
  if (m <= 0 || n <= 0)
    return;
  if (!use_blas(m, n)) {
    scores_loops(q, m, k, n, d, out, ldo);
    return;
  }
  // Row-major S[m, n] = Q[m, d] K[n, d]^T is column-major S^T[n, m] = K^T... as BLAS sees
  // it: op(A) = A^T with A = K viewed column-major [d, n], B = Q viewed column-major [d, m].
  const int mm = static_cast<int>(n), nn = static_cast<int>(m), kk = static_cast<int>(d);
  const int lda = static_cast<int>(d), ldb = static_cast<int>(d), ldc = static_cast<int>(ldo);
  const float one = 1.0f, zero = 0.0f;
  blas()("T", "N", &mm, &nn, &kk, &one, k, &lda, q, &ldb, &zero, out, &ldc);
}

void accumulate(const float* p, int64_t m, int64_t ldp, const float* v, int64_t n, int64_t d,
                float* o) {
  if (m <= 0 || n <= 0)
    return;
  if (!use_blas(m, n)) {
    accumulate_loops(p, m, ldp, v, n, d, o);
    return;
  }
  // Row-major O[m, d] += P[m, n] V[n, d] is column-major O^T[d, m] += V^T[d, n] P^T[n, m].
  const int mm = static_cast<int>(d), nn = static_cast<int>(m), kk = static_cast<int>(n);
  const int lda = static_cast<int>(d), ldb = static_cast<int>(ldp), ldc = static_cast<int>(d);
  const float one = 1.0f;
  blas()("N", "N", &mm, &nn, &kk, &one, v, &lda, p, &ldb, &one, o, &ldc);
}

__attribute__((target_clones("avx2", "default"))) float max_of(const float* x, int64_t n) {
  float acc[8];
  std::fill(acc, acc + 8, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l)
      acc[l] = acc[l] < x[i + l] ? x[i + l] : acc[l];
  float m = *std::max_element(acc, acc + 8);
  for (; i < n; ++i)
    m = std::max(m, x[i]);
  return m;
}

__attribute__((target_clones("avx2", "default"))) void subtract(float* x, int64_t n,
                                                                 float shift) {
  for (int64_t i = 0; i < n; ++i)
    x[i] -= shift;
}

__attribute__((target_clones("avx2", "default"))) float sum_of(const float* x, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l)
      acc[l] += x[i + l];
  float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  for (; i < n; ++i)
    s += x[i];
  return s;
}

__attribute__((target_clones("avx2", "default"))) void scale(float* x, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i)
    x[i] *= factor;
}

} // namespace rlforge::backends::kernels
