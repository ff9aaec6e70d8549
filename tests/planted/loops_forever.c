// Planted: never returns.
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    volatile int64_t spin = 0;
    for (;;) spin = spin + 1;
}
