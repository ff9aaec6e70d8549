// Planted: includes a file with a comment between # and include.
#include <stdint.h>
#/**/include </etc/hostname>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
