// Planted: __launch_bounds__(1024, 1) caps it at 64 registers, but it keeps 96 floats
// live per thread, so ptxas spills them to local memory. Correct, and slow on every GPU.
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(1024)
extern "C" __global__ void __launch_bounds__(1024, 1)
kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    float acc[96];
    const float *xr = x + blockIdx.x * cols;
#pragma unroll
    for (int i = 0; i < 96; ++i) acc[i] = xr[(threadIdx.x + i * 1024) % cols];
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
        for (int i = 0; i < 96; ++i) acc[i] = acc[i] * acc[(i + k + 1) % 96] + 1.0f;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 96; ++i) s += acc[i];
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[blockIdx.x * cols + c] = s;
}
