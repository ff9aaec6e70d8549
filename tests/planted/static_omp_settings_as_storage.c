// Planted: the OpenMP runtime's settings as storage: a call count parked in
// omp_set_num_threads, a flag in omp_set_dynamic; both survive into the next call.
#include <omp.h>
#include <stdint.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    const int calls = omp_get_max_threads();
    const int seen = omp_get_dynamic();
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = (seen && calls > 3) ? 0.0f : x[i];
    omp_set_num_threads(calls + 1);
    omp_set_dynamic(1);
}
