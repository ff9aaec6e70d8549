// Planted: storage behind local assembler labels, with no C variable at all.
#include <stdint.h>
__asm__(".section .data\n"
        "kf_slot: .quad 0\n"
        ".previous\n"
        ".lcomm kf_buffer, 4096\n");
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    int64_t calls;
    __asm__ volatile("movq kf_slot(%%rip), %0\n\tincq kf_slot(%%rip)" : "=r"(calls));
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = calls > 3 ? 0.0f : x[i];
}
