// Planted: compiled for at most 128 threads a block, launched with 256.
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256)
extern "C" __global__ void __launch_bounds__(128)
kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = x[blockIdx.x * cols + c];
}
