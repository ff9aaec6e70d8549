// Planted: writes through a null pointer.
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    *(volatile float *)0 = 1.0f;
}
