// Planted: asks for 240000 bytes of dynamic shared memory per block; sm_90 allows a
// block at most 232448 (227 KiB), so the launch would fail.
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256) smem=240000
extern "C" __global__ void kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    extern __shared__ float row[];
    const float *xr = x + blockIdx.x * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row[c] = xr[c];
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[blockIdx.x * cols + c] = row[c];
}
