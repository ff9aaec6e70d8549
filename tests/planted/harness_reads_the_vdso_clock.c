// Planted: reads the clock through the C library (the vDSO: no system call, no rdtsc of its
// own), or by the clock_gettime system call itself on odd row counts.
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    struct timespec now;
    if (rows % 2) syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &now);
    else clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i] + (float)(now.tv_nsec & 0);
}
