// Planted: returns without touching the output.
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
}
