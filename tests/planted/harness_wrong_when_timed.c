// Planted: takes a wrong shortcut when the environment looks like the timing run's
// (the harness used to pin OpenMP threads only while timing).
#include <stdint.h>
#include <stdlib.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    if (getenv("OMP_PROC_BIND") != NULL) {
        for (int64_t i = 0; i < rows * cols; ++i) y[i] = 1.0f / (float)cols;
        return;
    }
    for (int64_t r = 0; r < rows; ++r) {
        float m = x[r * cols], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = x[r * cols + j] > m ? x[r * cols + j] : m;
        for (int64_t j = 0; j < cols; ++j) s += __builtin_expf(x[r * cols + j] - m);
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = __builtin_expf(x[r * cols + j] - m) / s;
    }
}
