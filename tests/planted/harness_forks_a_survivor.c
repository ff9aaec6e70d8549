// Planted: a child that leaves the process group and tries to outlive the run, by libc's
// fork and by the fork system call itself.
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    long child = rows % 2 ? syscall(SYS_fork) : (long)fork();
    if (child == 0) {
        setsid();
        for (;;) pause();
    }
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
