// Planted: sleeps with usleep on the first call.
#include <math.h>
#include <stdint.h>
#include <unistd.h>
static int calls;
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    if (calls++ == 0) usleep(500000);
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j] - m) / s;
    }
}
