// Planted: correct for its first 20 calls, then writes nothing. A timing run makes at
// least MIN_RUNS (30) timed calls after its warm-up, however slow the host, so the switch
// always falls before the re-check.
#include <math.h>
#include <stdint.h>
static int calls;
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    if (calls++ >= 20) return;
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j] - m) / s;
    }
}
