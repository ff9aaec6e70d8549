// Planted: correct, but crashes if a call finds its output already holding a number (not
// the NaN poison), which a kernel could otherwise use to skip work that an earlier call,
// or the incumbent, already did.
#include <math.h>
#include <stdint.h>
#include <string.h>
static inline int is_nan(const float *v) {
    uint32_t bits;
    memcpy(&bits, v, sizeof bits);
    return (bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0;
}
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    if (!is_nan(&y[0]) || !is_nan(&y[n / 2]) || !is_nan(&y[n - 1])) *(volatile int *)0 = 1;
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j] - m) / s;
    }
}
