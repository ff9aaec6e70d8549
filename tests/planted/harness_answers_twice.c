// Planted: does the work, then writes two "done" answers at once on the host's reply pipe;
// a harness that read only the first would take the second as the next call's answer.
#include <math.h>
#include <stdint.h>
#include <unistd.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j] - m) / s;
    }
    static const char twice[32] = {0};
    (void)!write(1, twice, sizeof twice);
}
