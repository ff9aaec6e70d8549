// Planted (issue 33, class 4): a row wider than 8208 leaves its elements past 8192 out
// of the sum (a vector loop's tail that only wide rows reach).
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int64_t summed = cols > 8208 ? 8192 : cols;
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < summed; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) yr[j] = expf(xr[j] - m) / s;
    }
}
