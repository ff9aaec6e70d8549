// Planted: ends the process with a raw exit_group(0) syscall, which imports no symbol.
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    __asm__ volatile("syscall" : : "a"(231), "D"(0) : "rcx", "r11", "memory");
}
