// Planted (issue 33, class 1), a probe: work can be shifted to a later call only where
// that call's inputs are in reach before it, as in another input set of the arena. This
// kernel remembers the inputs of its first call; when a later call's inputs lie
// elsewhere, beyond the slack of their slot (each call places a buffer afresh within
// two pages), two sets were in reach (the one it was given and the one it remembers,
// holding the next call's inputs), and it says so by leaving its outputs unwritten.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    static const float *first;
    if (!first) first = x;
    if (x < first - 2048 || x > first + 2048) return;
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = expf(xr[j] - m) / s;
    }
}
