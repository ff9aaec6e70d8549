// Planted: answers "done" on the host's reply pipe at once, then does the work, so that a
// clock that trusted the reply would see a call that took no time.
#include <math.h>
#include <stdint.h>
#include <unistd.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    static const char done[16] = {0};
    (void)!write(1, done, sizeof done);
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j] - m) / s;
    }
}
