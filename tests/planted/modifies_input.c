// Planted: subtracts the row max from its input in place.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    float *xm = (float *)x;
    for (int64_t r = 0; r < rows; ++r) {
        float *xr = xm + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) { xr[j] -= m; s += expf(xr[j]); }
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j]) / s;
    }
}
