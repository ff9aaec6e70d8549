/* Hand-written row softmax for AVX2 + FMA (bench/softmax_limit.py times them beside
   Kernel Tuner's best and the factory's best). One file, built once per variant:
     STRUCTURE 0: three passes with the row in L1: max; y = exp(x - max) and its sum; y *= 1/sum
     STRUCTURE 1: max; exp into a per-thread L1 row buffer;
                  y = buffer * 1/sum with non-temporal stores (the final write only)
     STRUCTURE 2: as 1 with ordinary stores
     STRUCTURE 3: online: one sweep for a running max and rescaled sum, then y = exp(x - m) / sum
     EXP 0: the factory's Cephes exp (Cody-Waite, degree 6), as kf_exp / v_exp
     EXP 4, 5: exp(x - m) = 2^t, t = (x - m) log2(e), and 2^frac(t) by a polynomial of
               that degree (max relative error 2.7e-6, 2.3e-7). A degree 3 (7.5e-5) was
               dropped: softmax's sum of such exps exceeds the 1e-4 tolerance.
     EXP 6: EXP 4 split by a rounding constant instead of conversions (the template's
            exp2_4 with 8 floats and FMA)
     PREFETCH_IN 1 (the default): structures 0-2 prefetch the row AHEAD rows on (1) to L2
            during the exp pass, the longest stretch of arithmetic; 0: during the scale
            pass (structures 1 and 2 only). The exp pass is faster on a 2-core AVX2 EPYC,
            as for the template's `prefetch_pass` (bench/softmax_limit.py --point).
   Every loop keeps 4 independent accumulators; any shape is taken (a row's last
   cols % 32 elements one at a time). Built with -O3 -march=native -ffast-math
   -fopenmp, as the factory's fastest points. */
#include <float.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef STRUCTURE
#define STRUCTURE 0
#endif
#ifndef EXP
#define EXP 5
#endif
#ifndef PREFETCH_IN
#define PREFETCH_IN 1
#endif
#ifndef AHEAD
#define AHEAD 1
#endif

#define W 8
#define L2E 1.44269504088896341f

static inline __m256 set1(float x) { return _mm256_set1_ps(x); }

#if EXP != 0 && EXP != 4 && EXP != 5 && EXP != 6
#error "EXP is 0, 4, 5 or 6"
#endif

#if EXP == 0
/* exp(d), d = x - m, the factory's algorithm */
static inline __m256 exp_of(__m256 x, __m256 m, __m256 neg_m_l2e) {
    (void)neg_m_l2e;
    __m256 d = _mm256_sub_ps(x, m);
    d = _mm256_min_ps(set1(88.0f), _mm256_max_ps(set1(-87.0f), d));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(d, set1(L2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, set1(0.693359375f), d);
    r = _mm256_fmadd_ps(n, set1(2.12194440e-4f), r);
    __m256 p = set1(1.9875691500E-4f);
    p = _mm256_fmadd_ps(p, r, set1(1.3981999507E-3f));
    p = _mm256_fmadd_ps(p, r, set1(8.3334519073E-3f));
    p = _mm256_fmadd_ps(p, r, set1(4.1665795894E-2f));
    p = _mm256_fmadd_ps(p, r, set1(1.6666665459E-1f));
    p = _mm256_fmadd_ps(p, r, set1(5.0000001201E-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), set1(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
}
#endif

/* exp(x - m) = 2^t for t <= 0: n = trunc(t - 0.5) is round-to-nearest there, f = t - n.
   t = (x - m) log2(e), as the template's sm_exp: the one-FMA form x log2(e) - m log2(e)
   saves an op but loses digits where |m| is large (|m| = 1e4: 6e-4 relative). 2^f by a
   polynomial of degree 5 (fine) or 4. */
static inline __m256 exp2_split(__m256 x, __m256 m, __m256i *ni) {
    __m256 t = _mm256_mul_ps(_mm256_sub_ps(x, m), set1(L2E));
    t = _mm256_max_ps(set1(-126.0f), t);
    *ni = _mm256_cvttps_epi32(_mm256_sub_ps(t, set1(0.5f)));
    return _mm256_sub_ps(t, _mm256_cvtepi32_ps(*ni));
}

static inline __m256 scaled(__m256 p, __m256i ni) {
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(ni, 23)));
}

static inline __m256 exp_fine(__m256 x, __m256 m) {
    __m256i ni;
    const __m256 f = exp2_split(x, m, &ni);
    __m256 p = set1(0.001327647129073739f);
    p = _mm256_fmadd_ps(p, f, set1(0.009675541892647743f));
    p = _mm256_fmadd_ps(p, f, set1(0.05550713092088699f));
    p = _mm256_fmadd_ps(p, f, set1(0.24022120237350464f));
    p = _mm256_fmadd_ps(p, f, set1(0.6931469440460205f));
    p = _mm256_fmadd_ps(p, f, set1(1.0000001192092896f));
    return scaled(p, ni);
}

#if EXP == 6
/* EXP 4's polynomial on the same f in [-1/2, 1/2], with the split done by a rounding
   constant: k = t + 1.5 2^23 holds t rounded to nearest in its low mantissa bits, so no
   conversions (11 operations to EXP 4's 13); the FMA builtins keep -ffast-math from
   folding t - (k - 1.5 2^23) into 0. Below d = -87 (exp under 2^-125) the result is only near 0. */
static inline __m256 exp_of(__m256 x, __m256 m, __m256 neg_m_l2e) {
    (void)neg_m_l2e;
    const __m256 d = _mm256_max_ps(set1(-87.0f), _mm256_sub_ps(x, m));
    const __m256 k = _mm256_fmadd_ps(d, set1(L2E), set1(12582912.0f));
    const __m256 f = _mm256_fmsub_ps(d, set1(L2E), _mm256_sub_ps(k, set1(12582912.0f)));
    __m256 p = set1(0.009570101276040077f);
    p = _mm256_fmadd_ps(p, f, set1(0.05591786280274391f));
    p = _mm256_fmadd_ps(p, f, set1(0.240247443318367f));
    p = _mm256_fmadd_ps(p, f, set1(0.6931217908859253f));
    p = _mm256_fmadd_ps(p, f, set1(0.9999992847442627f));
    return scaled(p, _mm256_castps_si256(k));
}
#elif EXP == 5
static inline __m256 exp_of(__m256 x, __m256 m, __m256 neg_m_l2e) {
    (void)neg_m_l2e;
    return exp_fine(x, m);
}
#elif EXP == 4
static inline __m256 exp_of(__m256 x, __m256 m, __m256 neg_m_l2e) {
    (void)neg_m_l2e;
    __m256i ni;
    const __m256 f = exp2_split(x, m, &ni);
    __m256 p = set1(0.009570101276040077f);
    p = _mm256_fmadd_ps(p, f, set1(0.05591786280274391f));
    p = _mm256_fmadd_ps(p, f, set1(0.240247443318367f));
    p = _mm256_fmadd_ps(p, f, set1(0.6931217908859253f));
    p = _mm256_fmadd_ps(p, f, set1(0.9999992847442627f));
    return scaled(p, ni);
}
#endif

static inline float hmax(__m256 v) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

static inline float hsum(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_shuffle_ps(a, a, 1));
    return _mm_cvtss_f32(a);
}

/* The vector loops take 4 (or 2) vectors a step; the last n % 32 (or 16) elements of a row
   are done one at a time, with the same exp. Rows start anywhere (cols need not be a
   multiple of 8), so loads are unaligned ones. */
static inline float exp1(float x, float m) {
    return _mm256_cvtss_f32(exp_of(set1(x), set1(m), set1(-m * L2E)));
}

static inline int64_t whole(int64_t n, int64_t step) { return n - n % step; }

static float row_max(const float *x, int64_t n) {
    __m256 m0 = set1(-FLT_MAX), m1 = m0, m2 = m0, m3 = m0;
    int64_t j = 0;
    for (; j < whole(n, 4 * W); j += 4 * W) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + j));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + j + W));
        m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + j + 2 * W));
        m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + j + 3 * W));
    }
    float m = hmax(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    for (; j < n; ++j) m = x[j] > m ? x[j] : m;
    return m;
}

/* e[j] = exp(x[j] - m); returns the sum. With PREFETCH_IN 1, the row `next` is
   prefetched to L2 during this pass, the longest one that touches no memory */
static float exp_into(const float *x, float *e, int64_t n, float m, const float *next) {
    const __m256 vm = set1(m), nml = set1(-m * L2E);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    (void)next;
    for (; j < whole(n, 4 * W); j += 4 * W) {
#if PREFETCH_IN == 1
        if (next != NULL) {
            _mm_prefetch((const char *)(next + j), _MM_HINT_T1);
            _mm_prefetch((const char *)(next + j + 16), _MM_HINT_T1);
        }
#endif
        const __m256 e0 = exp_of(_mm256_loadu_ps(x + j), vm, nml);
        const __m256 e1 = exp_of(_mm256_loadu_ps(x + j + W), vm, nml);
        const __m256 e2 = exp_of(_mm256_loadu_ps(x + j + 2 * W), vm, nml);
        const __m256 e3 = exp_of(_mm256_loadu_ps(x + j + 3 * W), vm, nml);
        _mm256_storeu_ps(e + j, e0);
        _mm256_storeu_ps(e + j + W, e1);
        _mm256_storeu_ps(e + j + 2 * W, e2);
        _mm256_storeu_ps(e + j + 3 * W, e3);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
        s2 = _mm256_add_ps(s2, e2);
        s3 = _mm256_add_ps(s3, e3);
    }
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; j < n; ++j) {
        e[j] = exp1(x[j], m);
        s += e[j];
    }
    return s;
}

static void softmax_row(const float *x, float *y, float *buf, const float *next, int64_t n) {
#if STRUCTURE == 3
    (void)buf;
    (void)next;
    /* online: per lane running max and sum rescaled to it */
    __m256 m0 = set1(-FLT_MAX), m1 = m0, s0 = _mm256_setzero_ps(), s1 = s0;
    const int64_t body = whole(n, 2 * W);
    for (int64_t j = 0; j < body; j += 2 * W) {
        const __m256 x0 = _mm256_loadu_ps(x + j), x1 = _mm256_loadu_ps(x + j + W);
        const __m256 n0 = _mm256_max_ps(m0, x0), n1 = _mm256_max_ps(m1, x1);
        /* the running sums are rescaled at every step, so their factor is the fine exp
           whatever EXP is: a coarser one's error would compound along the row */
        s0 = _mm256_fmadd_ps(s0, exp_fine(m0, n0), exp_of(x0, n0, _mm256_mul_ps(n0, set1(-L2E))));
        s1 = _mm256_fmadd_ps(s1, exp_fine(m1, n1), exp_of(x1, n1, _mm256_mul_ps(n1, set1(-L2E))));
        m0 = n0;
        m1 = n1;
    }
    float m = hmax(_mm256_max_ps(m0, m1));
    for (int64_t j = body; j < n; ++j) m = x[j] > m ? x[j] : m;
    const __m256 vm = set1(m), nml = set1(-m * L2E);
    float s = hsum(_mm256_add_ps(_mm256_mul_ps(s0, exp_fine(m0, vm)),
                                 _mm256_mul_ps(s1, exp_fine(m1, vm))));
    for (int64_t j = body; j < n; ++j) s += exp1(x[j], m);
    const __m256 inv = set1(1.0f / s);
    for (int64_t j = 0; j < body; j += 2 * W) {
        _mm256_storeu_ps(y + j, _mm256_mul_ps(exp_of(_mm256_loadu_ps(x + j), vm, nml), inv));
        _mm256_storeu_ps(y + j + W,
                         _mm256_mul_ps(exp_of(_mm256_loadu_ps(x + j + W), vm, nml), inv));
    }
    for (int64_t j = body; j < n; ++j) y[j] = exp1(x[j], m) / s;
#else
    const float m = row_max(x, n);
#if STRUCTURE == 0
    (void)buf;
    (void)next;
    float *e = y;
#else
    float *e = buf;
#endif
    const float s = exp_into(x, e, n, m, next);
    const __m256 inv = set1(1.0f / s);
#if STRUCTURE == 1
    /* the non-temporal store needs 32-byte aligned rows; others take ordinary stores */
    const int stream = ((uintptr_t)y % 32) == 0;
#endif
    int64_t j = 0;
    for (; j < whole(n, 4 * W); j += 4 * W) {
#if STRUCTURE != 0 && PREFETCH_IN == 0
        if (next != NULL) {
            _mm_prefetch((const char *)(next + j), _MM_HINT_T1);
            _mm_prefetch((const char *)(next + j + 16), _MM_HINT_T1);
        }
#endif
        for (int k = 0; k < 4; ++k) {
            const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(e + j + k * W), inv);
#if STRUCTURE == 1
            if (stream) {
                _mm256_stream_ps(y + j + k * W, v);
                continue;
            }
#endif
            _mm256_storeu_ps(y + j + k * W, v);
        }
    }
    for (; j < n; ++j) y[j] = e[j] / s;
#endif
}

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel
    {
        float *buf = aligned_alloc(64, ((size_t)cols * sizeof(float) + 63) / 64 * 64);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const float *next = r + AHEAD < rows ? x + (r + AHEAD) * cols : NULL;
            softmax_row(x + r * cols, y + r * cols, buf, next, cols);
        }
#if STRUCTURE == 1
        _mm_sfence();
#endif
        free(buf);
    }
}
