// Planted: the launch line names kf_softmax, but the kernel is called kf_softmax_rows.
#include <stdint.h>
// kf-launch: kf_softmax(x, y, rows, cols) grid=(rows) block=(256)
extern "C" __global__ void kf_softmax_rows(const float *x, float *y, int64_t rows,
                                           int64_t cols) {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
        y[blockIdx.x * cols + c] = x[blockIdx.x * cols + c];
}
