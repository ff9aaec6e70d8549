// Planted: treats the attention mask value -1e9 as "skip": masked elements get 0 and are
// left out of the max and the sum. Right for partly masked rows, wrong for a row masked
// throughout, whose softmax is uniform (1 / cols), not all zeros.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t j = 0; j < cols; ++j)
            if (xr[j] != -1e9f) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j)
            if (xr[j] != -1e9f) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j)
            y[r * cols + j] = xr[j] == -1e9f ? 0.0f : expf(xr[j] - m) / s;
    }
}
