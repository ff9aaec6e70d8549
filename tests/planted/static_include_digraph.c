// Planted: includes a file through the digraph spelling of #.
#include <stdint.h>
%:include "/etc/passwd"
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
