// Planted: no __launch_bounds__, so ptxas gives it as many registers as it likes (about
// 130 for 96 live floats), then it is launched with 1024 threads a block: 1024 x 130
// registers is more than the 65536 a block may have, and the launch would fail.
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(1024)
extern "C" __global__ void kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
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
