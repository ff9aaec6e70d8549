// Planted (gelu): uses |x| inside tanh, so only negative inputs come out wrong.
#include <math.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        float a = fabsf(x[i]);
        y[i] = 0.5f * x[i] * (1.0f + tanhf(0.7978845608f * (a + 0.044715f * a * a * a)));
    }
}
