// Planted (issue 33, class 2): counts its calls in freed heap memory (no static state: a
// block freed at the end of each call comes back at the same place from the allocator),
// is honest for its first 40 calls (warm-up and the first timed ones), then wrong on one
// call in 40: every other row of that call is filled with 1/cols.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    uint64_t *block = malloc(256);
    uint64_t calls = block[16] == 0x6b66u << 16 ? block[17] : 0;
    block[16] = 0x6b66u << 16;
    block[17] = calls + 1;
    int wrong = calls >= 40 && calls % 40 == 39;
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        if (wrong && r % 2 == 0) {
            for (int64_t j = 0; j < cols; ++j) yr[j] = 1.0f / (float)cols;
            continue;
        }
        float m = xr[0], s = 0.0f;
        for (int64_t j = 0; j < cols; ++j) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < cols; ++j) s += expf(xr[j] - m);
        for (int64_t j = 0; j < cols; ++j) yr[j] = expf(xr[j] - m) / s;
    }
    free(block);
}
