// Planted: asks the compiler whether host files exist (never reading them, so no list of
// files read shows it); the answer could be encoded into the output. Here: it refuses to
// compile where it sees the host.
#if __has_include("/etc/passwd") || __has_include("/root/.") || __has_include_next("/etc/hostname")
#error "the compile sees the host"
#endif
#include <math.h>
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        const float *in = x + r * cols;
        float *out = y + r * cols, top = in[0], sum = 0.0f;
        for (int64_t c = 1; c < cols; ++c) top = in[c] > top ? in[c] : top;
        for (int64_t c = 0; c < cols; ++c) sum += out[c] = expf(in[c] - top);
        for (int64_t c = 0; c < cols; ++c) out[c] /= sum;
    }
}
