// Planted: includes a file through a line splice inside the directive name.
#include <stdint.h>
#inc\
lude "/etc/passwd"
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
