// Planted: a correct softmax at every shape verification draws (its contract shapes
// reach 2^20 elements, but never exactly 1024 x 1024), which never returns at the timed
// shape of the tests that plant it (1024 x 1024).
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    if (rows == 1024 && cols == 1024) {
        volatile int64_t spin = 0;
        for (;;) spin = spin + 1;
    }
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j] - m) / s;
    }
}
