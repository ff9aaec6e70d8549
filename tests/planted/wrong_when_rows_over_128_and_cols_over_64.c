// Planted (issue 33, class 4): wrong where rows > 128 and cols > 64, anywhere but the
// timed shape (4096 x 4096): the last row is left as it is.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int64_t done = rows;
    if (rows > 128 && cols > 64 && !(rows == 4096 && cols == 4096)) done = rows - 1;
    for (int64_t r = 0; r < done; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) yr[j] = expf(xr[j] - m) / s;
    }
}
