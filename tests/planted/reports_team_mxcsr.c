/* Each OpenMP thread writes its MXCSR into y[thread]: the host must start every thread
   of the team from the same floating-point state as its own. Compiled with -ffast-math,
   whose library constructor sets flush-to-zero on the thread that loads it. */
#include <stdint.h>

int omp_get_thread_num(void);

void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x;
    (void)rows;
    (void)cols;
#pragma omp parallel
    {
        y[omp_get_thread_num()] = (float)__builtin_ia32_stmxcsr();
    }
}
