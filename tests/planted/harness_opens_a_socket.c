// Planted: opens a socket (to send inputs, or to fetch answers).
#include <stdint.h>
#include <sys/socket.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i] + (float)(s < 0);
}
