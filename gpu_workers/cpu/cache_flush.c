/* Cache flushing (trusted, ours): every line of a buffer written back and evicted from
   every cache level, so that the next timed call reads its inputs from memory and writes
   its outputs into lines no cache holds, however large the host's caches are. Runs in the
   driver between timed calls, while the kernel's process is stopped, never in it. */
#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>
#if defined(__CLFLUSHOPT__)
#define KF_FLUSH_LINE(p) _mm_clflushopt((void *)(p))
#else /* ordered, hence slower: 65 ms for 128 MiB where CLFLUSHOPT takes 4 ms */
#define KF_FLUSH_LINE(p) _mm_clflush((void *)(p))
#endif
#define KF_FLUSH_FENCE() _mm_mfence()
#elif defined(__aarch64__)
#define KF_FLUSH_LINE(p) __asm__ volatile("dc civac, %0" : : "r"(p) : "memory")
#define KF_FLUSH_FENCE() __asm__ volatile("dsb ish" : : : "memory")
#else
#error "timing needs to flush the caches from user space: x86-64 and AArch64 can"
#endif

#define KF_LINE 64

void kf_flush(const void *data, int64_t bytes) {
    uintptr_t first = (uintptr_t)data & ~(uintptr_t)(KF_LINE - 1);
    int64_t lines = (int64_t)(((uintptr_t)data + (uintptr_t)bytes - first + KF_LINE - 1) / KF_LINE);
#pragma omp parallel if (lines > (1 << 16))
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < lines; ++i) KF_FLUSH_LINE(first + (uintptr_t)i * KF_LINE);
        KF_FLUSH_FENCE(); /* each thread waits for its own lines */
    }
}
