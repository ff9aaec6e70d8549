// Planted: from its fourth call on, stores into its input (the value already there, so
// no bit changes: a scratch write, or a stash put back before returning). Outputs right.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    static int64_t calls;
    if (calls++ >= 3) {
        volatile float *xm = (volatile float *)x;
        xm[0] = xm[0];
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j] - m) / s;
    }
}
