// Planted: a handler for SIGCONT, which the driver sends before every call: a call counter.
#include <signal.h>
#include <stdint.h>
static volatile int64_t continued;
static void on_cont(int sig) { (void)sig; ++continued; }
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    signal(SIGCONT, on_cont);
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i] + (float)(continued & 0);
}
