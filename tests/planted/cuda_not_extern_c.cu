// Planted: the kernel is not extern "C", so its name in the cubin is mangled and the
// loader cannot find kf_softmax.
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256)
__global__ void kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = x[blockIdx.x * cols + c];
}
