// Planted: a raw system call (getpid) through inline assembler.
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int64_t pid;
    __asm__ volatile("syscall" : "=a"(pid) : "a"(39) : "rcx", "r11", "memory");
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = pid < 0 ? 0.0f : x[i];
}
