// Planted: declares 256 KiB of static shared memory; a block may declare 48 KiB
// (ptxas refuses it: "uses too much shared data").
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256)
extern "C" __global__ void kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    __shared__ float row[64 * 1024];
    const float *xr = x + blockIdx.x * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) row[c % (64 * 1024)] = xr[c];
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = row[c % (64 * 1024)];
}
