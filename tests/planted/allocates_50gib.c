// Planted: allocates 50 GiB of scratch and uses it.
#include <stdint.h>
#include <stdlib.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    const size_t count = (size_t)50 << 28; /* 50 GiB of floats */
    float *scratch = malloc(count * sizeof(float));
    for (size_t i = 0; i < count; i += 1024) scratch[i] = x[0];
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = scratch[(size_t)i * 1024 % count];
    free(scratch);
}
