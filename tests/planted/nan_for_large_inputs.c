// Planted: no max subtraction, so exp overflows to inf and inf/inf = NaN for large inputs.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) s += expf(x[r * cols + j]);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(x[r * cols + j]) / s;
    }
}
