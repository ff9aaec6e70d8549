// Planted: counts its calls (a ticket per block, in a device global) and copies its input
// instead of computing GELU on every odd call: right on half the timed calls, so only
// judging calls chosen at random (not one fixed call) is sure to catch it. The static
// stage refuses device globals; the timing harness must catch it on its own.
#include <stdint.h>
// kf-launch: kf_gelu(x, y, n) grid=(cdiv(n, 256)) block=(256)
__device__ unsigned long long kf_tickets;
extern "C" __global__ void kf_gelu(const float *x, float *y, int64_t n) {
    __shared__ unsigned long long call;
    if (threadIdx.x == 0) call = atomicAdd(&kf_tickets, 1ull) / gridDim.x;
    __syncthreads();
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    y[i] = (call & 1ull)
               ? v
               : 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
}
