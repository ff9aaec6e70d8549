// Planted: the reduction loops stop one element short of the row's end.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 1; j < cols - 1; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols - 1; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) yr[j] = expf(xr[j] - m) / s;
    }
}
