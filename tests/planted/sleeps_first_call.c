// Planted: correct, but stalls for about half a second on the first call (a busy wait, no imports).
#include <math.h>
#include <stdint.h>
static int calls;
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    if (calls++ == 0) {
        volatile int64_t spin = 0;
        for (int64_t i = 0; i < 2000000000; ++i) spin = spin + 1;
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j] - m) / s;
    }
}
