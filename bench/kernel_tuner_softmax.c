/* Row softmax for Kernel Tuner's comparison (bench/kernel_tuner_softmax.py): the 96-point
   space of issue 13, as Kernel Tuner sees it. KT defines the tunables as macros:
   THREADS (OpenMP threads), ALGORITHM (0: max, exp+sum, scale; 1: online max+sum by
   blocks, then exp and scale), VECTOR_WIDTH (omp simd simdlen), UNROLL (vectors per step
   of the exp loops: simdlen VECTOR_WIDTH * UNROLL) and FAST_EXP (0: libm expf; 1: a Cephes polynomial,
   built with -ffast-math). Valid C and C++. Plain
   `#pragma omp` lines (macros expand in them): Kernel Tuner looks for that text to know
   that a library uses OpenMP and must not be unloaded (unloading one crashed it). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <time.h>

#define KT_BLOCK 1024 /* the online algorithm's block: a running max per block */

static inline float kt_fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = __builtin_rintf(x * 1.44269504088896341f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } s;
    s.i = ((int32_t)n + 127) << 23;
    return p * s.f;
}

#if FAST_EXP
#define KT_EXP kt_fast_exp
#else
#define KT_EXP expf
#endif

static void softmax_row(const float *__restrict__ x, float *__restrict__ y, int64_t n) {
#if ALGORITHM == 0
    float m = -FLT_MAX;
    #pragma omp simd simdlen(VECTOR_WIDTH) reduction(max : m)
    for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
    float s = 0.0f;
    #pragma omp simd simdlen(VECTOR_WIDTH * UNROLL) reduction(+ : s)
    for (int64_t j = 0; j < n; ++j) {
        const float e = KT_EXP(x[j] - m);
        y[j] = e;
        s += e;
    }
    const float inv = 1.0f / s;
    #pragma omp simd simdlen(VECTOR_WIDTH)
    for (int64_t j = 0; j < n; ++j) y[j] *= inv;
#else
    float m = -FLT_MAX, s = 0.0f;
    for (int64_t j0 = 0; j0 < n; j0 += KT_BLOCK) {
        const int64_t end = j0 + KT_BLOCK < n ? j0 + KT_BLOCK : n;
        float bm = -FLT_MAX;
        #pragma omp simd simdlen(VECTOR_WIDTH) reduction(max : bm)
        for (int64_t j = j0; j < end; ++j) bm = x[j] > bm ? x[j] : bm;
        if (bm > m) {
            s *= KT_EXP(m - bm);
            m = bm;
        }
        float bs = 0.0f;
            #pragma omp simd simdlen(VECTOR_WIDTH * UNROLL) reduction(+ : bs)
        for (int64_t j = j0; j < end; ++j) bs += KT_EXP(x[j] - m);
        s += bs;
    }
    const float inv = 1.0f / s;
    #pragma omp simd simdlen(VECTOR_WIDTH * UNROLL)
    for (int64_t j = 0; j < n; ++j) y[j] = KT_EXP(x[j] - m) * inv;
#endif
}

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    #pragma omp parallel for schedule(static) num_threads(THREADS)
    for (int64_t r = 0; r < rows; ++r) softmax_row(x + r * cols, y + r * cols, cols);
}

/* What Kernel Tuner's C backend calls: it takes the returned milliseconds as the time. */
float softmax_kt(const float *x, float *y, int rows, int cols) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    kernel(x, y, rows, cols);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (float)((double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6);
}
