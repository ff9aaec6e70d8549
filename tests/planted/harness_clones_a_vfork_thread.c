// Planted: clone(CLONE_VFORK | CLONE_THREAD): the calling thread waits, uninterruptibly
// (state D, which SIGSTOP cannot stop), for a child thread that never ends.
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
static int never;
void kernel(const float *x, float *y, int64_t rows, int64_t cols) {
    long flags = 0x100 | 0x800 | 0x10000 | 0x4000;  // CLONE_VM, _SIGHAND, _THREAD, _VFORK
    if (syscall(SYS_clone, flags, 0L, 0L, 0L, 0L) == 0)  // the child, on the parent's stack
        for (;;) syscall(SYS_futex, &never, FUTEX_WAIT, 0, 0L, 0L, 0);
    for (int64_t i = 0; i < rows * cols; ++i) y[i] = x[i];
}
