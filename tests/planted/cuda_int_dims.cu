// Planted: takes its dims as int; the loader passes int64_t, so the kernel would read
// `cols` from the upper half of `rows`.
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256)
extern "C" __global__ void kf_softmax(const float *x, float *y, int rows, int cols) {
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = x[blockIdx.x * cols + c];
}
