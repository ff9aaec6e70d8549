// Planted: writes the word just before its output.
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    y[-1] = 0.0f;
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
