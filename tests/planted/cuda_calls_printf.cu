// Planted: prints from the device; printf output lands in the worker's stdout.
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256)
#define SAY printf
extern "C" __global__ void kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (threadIdx.x == 0) SAY("row %lld\n", (long long)blockIdx.x);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = x[blockIdx.x * cols + c];
}
