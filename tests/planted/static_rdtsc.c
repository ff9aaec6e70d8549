// Planted: reads the time-stamp counter through the intrinsic, no assembler in sight.
#include <stdint.h>
#include <x86intrin.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    const uint64_t t = __rdtsc();
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
    if (t == 42) y[0] = 0.0f;  /* once in 2^64 calls: the clock is what matters */
}
