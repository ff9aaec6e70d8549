// Planted: rows in parallel, but every thread shares one scratch row and one sum.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    float scratch[cols];
    float total = 0.0f;
#pragma omp parallel for num_threads(2) schedule(static, 1) shared(scratch, total)
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float m = xr[0];
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        total = 0.0f;
        for (int64_t j = 0; j < cols; ++j) {
            scratch[j] = expf(xr[j] - m);
            total += scratch[j];
        }
        for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = scratch[j] / total;
    }
}
