// Planted: leaves a file behind, outside any scratch dir.
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int fd = open("/tmp/kf-planted-escape", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) (void)!write(fd, x, 4);
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
