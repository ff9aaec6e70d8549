// Planted (issue 33, class 2): reads the poison its output starts from. The re-check after
// timing used another pattern (0xFFC0FFEE) than timed calls (0x7FBADBAD): it is honest
// there and on its first 40 calls, and wrong on every 40th call it takes for a timed one.
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    uint32_t first;
    memcpy(&first, y, sizeof first);
    uint64_t *block = malloc(256);
    uint64_t calls = block[16] == 0x6b67u << 16 ? block[17] : 0;
    block[16] = 0x6b67u << 16;
    block[17] = calls + 1;
    int wrong = first == 0x7FBADBADu && calls >= 40 && calls % 40 == 39;
    for (int64_t r = 0; r < rows; ++r) {
        const float *xr = x + r * cols;
        float *yr = y + r * cols;
        if (wrong) {
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
