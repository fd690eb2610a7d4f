#pragma once

#include <cstdint>

namespace rlforge::backends::kernels {

/// fp32 building blocks of the paged attention, on raw row-major memory. Products go to the BLAS
/// libtorch loaded (`sgemm_`, found at run time; OpenBLAS here, whose small-matrix kernels also
/// serve a decoding sequence's two query rows well), or, when no BLAS is loaded, to loops
/// compiled for AVX2 when the CPU has it. Single-threaded: callers parallelise over independent
/// work (OpenBLAS runs one thread inside an OpenMP region). Thread-safe (no shared state after
/// the first call).

/// `out[r * ldo + t] = dot(q[r], k[t])` for r < m, t < n; q rows are `d` floats apart, k rows
/// `d` floats apart.
void scores(const float* q, int64_t m, const float* k, int64_t n, int64_t d, float* out,
            int64_t ldo);

/// `o[r] += sum_t p[r * ldp + t] * v[t]` for r < m (o and v rows `d` floats apart).
void accumulate(const float* p, int64_t m, int64_t ldp, const float* v, int64_t n, int64_t d,
                float* o);

/// The largest of `x[0 .. n)` (-inf when n == 0).
float max_of(const float* x, int64_t n);

/// `x[i] -= shift` for i < n.
void subtract(float* x, int64_t n, float shift);

/// Sum of `x[0 .. n)`.
float sum_of(const float* x, int64_t n);

/// `x[i] *= factor` for i < n.
void scale(float* x, int64_t n, float factor);

/// Whether products go to a BLAS `sgemm_` (false: every product uses the loops).
bool have_blas();

/// Runs the products with the loops even when a BLAS is loaded (tests compare both paths).
/// Not thread-safe against concurrent products; set it before using the kernels.
void force_loops(bool on);

} // namespace rlforge::backends::kernels
