// Planted: no asm keyword, yet the section name is copied into the assembly verbatim, so
// its newline starts a directive of its own that reads a file into the object.
#include <stdint.h>
__attribute__((section(".rodata.q\n.inc" "bin \"/etc/hostname\"\n.section .rodata.z")))
const char kf_file[1] = {0};
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i] + (float)kf_file[0];
}
