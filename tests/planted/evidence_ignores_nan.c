// Planted: fmaxf drops NaN from the row max, and the exponent is clamped with fmaxf too, so
// a NaN input becomes exp(-88) ~ 0: a row holding NaN comes out as a plausible, finite
// softmax of its other elements instead of NaN.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = fmaxf(m, xr[j]);
        for (int64_t j = 0; j < cols; ++j) s += expf(fmaxf(xr[j] - m, -88.0f));
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(fmaxf(xr[j] - m, -88.0f)) / s;
    }
}
