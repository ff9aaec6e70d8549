// Planted: a call counter in a section named like relocated read-only data.
#include <stdint.h>
__attribute__((section(".data.rel.ro.x"))) int64_t kf_calls = 1;
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = kf_calls > 3 ? 0.0f : x[i];
    kf_calls += 1;
}
