// Planted: includes a file named by a macro.
#include <stdint.h>
#define P </etc/passwd>
#include P
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
