// Planted: remembers its answer per input pointer in device globals and, when it meets
// a pointer again, writes the remembered answer instead of computing. Right whenever a
// call's inputs are those of the last call on the same pointer (inputs that never change
// between timed calls), wrong once they change. The static stage refuses device globals;
// the timing harness must catch it on its own, by changing the inputs before every call.
#include <stdint.h>
#define KF_CACHED (1 << 16)
#define KF_SLOTS 8
// kf-launch: kf_gelu(x, y, n) grid=(cdiv(n, 256)) block=(256)
__device__ unsigned long long kf_tag[KF_SLOTS][KF_CACHED];
__device__ float kf_answer[KF_SLOTS][KF_CACHED];
extern "C" __global__ void kf_gelu(const float *x, float *y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned long long tag = (unsigned long long)(uintptr_t)x;
    int slot = -1;
    if (i < KF_CACHED) {
        for (int s = 0; s < KF_SLOTS; ++s) {
            if (kf_tag[s][i] == tag) {
                y[i] = kf_answer[s][i];
                return;
            }
            if (slot < 0 && kf_tag[s][i] == 0) slot = s;
        }
    }
    float v = x[i];
    float r = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    y[i] = r;
    if (slot >= 0) {
        kf_answer[slot][i] = r;
        kf_tag[slot][i] = tag;
    }
}
