// Planted: counts its launches in a __device__ variable and stops working after 100,
// the CUDA form of stops_after_warmup.c. Device globals outlive a launch.
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256)
__device__ unsigned int kf_calls;
extern "C" __global__ void kf_softmax(const float *x, float *y, int64_t rows, int64_t cols) {
    if (kf_calls > 100 * rows) return;
    if (threadIdx.x == 0) atomicAdd(&kf_calls, 1u);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = x[blockIdx.x * cols + c];
}
