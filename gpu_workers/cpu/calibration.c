/* Host calibration kernels (trusted, ours): the fastest way this CPU moves and multiplies. */
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
int kf_streaming_stores = 1;
#else
int kf_streaming_stores = 0;
#endif

/* All cores, non-temporal stores: read n floats, write n floats. */
void kf_stream_copy(const float *src, float *dst, int64_t n) {
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < n / 64; ++b) {
            const float *s = src + b * 64;
            float *d = dst + b * 64;
#if defined(__AVX512F__)
            for (int i = 0; i < 64; i += 16) _mm512_stream_ps(d + i, _mm512_load_ps(s + i));
#elif defined(__AVX__)
            for (int i = 0; i < 64; i += 8) _mm256_stream_ps(d + i, _mm256_load_ps(s + i));
#elif defined(__SSE2__)
            for (int i = 0; i < 64; i += 4) _mm_stream_ps(d + i, _mm_load_ps(s + i));
#else
            memcpy(d, s, 64 * sizeof(float));
#endif
        }
#if defined(__SSE2__)
        _mm_sfence();
#endif
    }
    for (int64_t i = (n / 64) * 64; i < n; ++i) dst[i] = src[i];
}

/* All cores, independent FMA chains in the widest vectors the CPU has: the arithmetic
   ceiling. The empty asm keeps each chain in a register, so it needs a register that wide. */
#if defined(__AVX512F__)
#define KF_LANES 16
#elif defined(__AVX__)
#define KF_LANES 8
#else
#define KF_LANES 4
#endif
typedef float kf_v __attribute__((vector_size(4 * KF_LANES)));
#define KF_STEP(x) x = x * a + b
double kf_fma_peak(int64_t iterations) {
    double total = 0.0;
#pragma omp parallel reduction(+ : total)
    {
        const kf_v a = (kf_v){0} + 0.999999f, b = (kf_v){0} + 1e-7f;
        kf_v c0 = a, c1 = a + 1, c2 = a + 2, c3 = a + 3, c4 = a + 4, c5 = a + 5;
        kf_v c6 = a + 6, c7 = a + 7, c8 = a + 8, c9 = a + 9, c10 = a + 10, c11 = a + 11;
        for (int64_t i = 0; i < iterations; ++i) {
            KF_STEP(c0); KF_STEP(c1); KF_STEP(c2); KF_STEP(c3); KF_STEP(c4); KF_STEP(c5);
            KF_STEP(c6); KF_STEP(c7); KF_STEP(c8); KF_STEP(c9); KF_STEP(c10); KF_STEP(c11);
            __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5));
            __asm__ volatile("" : "+v"(c6), "+v"(c7), "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));
        }
        kf_v sum = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11;
        float sink = 0.0f;
        for (int l = 0; l < KF_LANES; ++l) sink += sum[l];
        total += 2.0 * KF_LANES * 12 * (double)iterations + (sink == 12345.0f);
    }
    return total;
}
