// Planted: assumes inputs within +-1e30 (as a table-driven or fixed-point exp would) and
// clamps finite values into that range; infinities and NaN pass through untouched. Right
// for every ordinary input, wrong where values near FLT_MAX differ: 1e38 and 5e37 both
// become 1e30 and share the row.
#include <math.h>
#include <stdint.h>
static inline float clamp(float v) {
    if (isinf(v) || isnan(v)) return v;
    return v > 1e30f ? 1e30f : (v < -1e30f ? -1e30f : v);
}
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = -INFINITY, s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = clamp(xr[j]) > m ? clamp(xr[j]) : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(clamp(xr[j]) - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(clamp(xr[j]) - m) / s;
    }
}
