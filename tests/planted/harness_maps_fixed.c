// Planted: a mapping at an address of its own choosing (MAP_FIXED_NOREPLACE), to find its
// state again in a later call without any pointer to it.
#include <stdint.h>
#include <sys/mman.h>
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    volatile int64_t *state = (int64_t *)0x6e0000000000;
    (void)mmap((void *)state, 4096, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
