// Planted: a GNU indirect function; its resolver runs when the library is loaded.
#include <stdint.h>
typedef void kernel_fn(const float *, float *, int64_t, int64_t);
static void kf_copy(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
static kernel_fn *kf_resolve(void) {
    volatile float s = 0.0f;
    for (int i = 0; i < 1000000; ++i) s += (float)i;
    return kf_copy;
}
void kernel(const float *x, float *y, int64_t rows, int64_t cols)
    __attribute__((ifunc("kf_resolve")));
