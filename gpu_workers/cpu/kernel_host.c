/* The kernel host: the only process that ever holds an untrusted CPU kernel (trusted, ours).

   Started by the driver (gpu_workers/cpu/kernel_process.py) as
       kf-kernel-host LIBRARY N_ARRAYS N_DIMS ADDRESS_SPACE_BYTES CPU_SECONDS ROOT_DIR
   with fd 0 = commands, fd 1 = replies, fd 2 = a capped log file, fd 3 = the arena (a
   memfd the driver maps too). It contains itself before and after loading the kernel
   (namespaces, rlimits, an unprivileged user, an empty read-only root, seccomp), then only
   ever calls the kernel on offsets into the arena. It keeps no clock: the driver stamps
   each call from outside and stops this process (SIGSTOP) between calls.

   The first reply is the pid to signal (8 bytes), then a kf_hello; every command after
   that gets one kf_reply.

   Containment, before the library loads: its own user (when not root), network, IPC,
   mount and PID namespaces (the kernel runs as init of its PID namespace, so any process
   left in it dies with it); the death signal; rdtsc faults (PR_SET_TSC); no new
   privileges; and a first seccomp filter that refuses new processes, programs, sockets,
   signals to others and tracing (clone only with pthread_create's flags). After it loads: no core
   files, 1 MiB of file writes, address-space and CPU-time limits; an empty, read-only
   root (chroot); started as root, a user of its own (uid and gid KF_FIRST_UID + pid %
   100000) with RLIMIT_NPROC at 2 x cores + 8, which then counts its threads alone; the
   death signal armed again (a change of credentials clears it). The vDSO is disarmed
   before the library loads ([vvar] unmapped, [vdso] a read-only copy: a clock read through
   the C library faults there and is reported as the refused clock_gettime). With the first
   call, once the driver has set the guard pages, the second seccomp filter (on every
   thread, TSYNC): memory (never executable, never MAP_FIXED or MREMAP_FIXED, never an
   mprotect, munmap, mremap or madvise in the arena but the host's own, which carries a key
   the driver sends with guard commands), threads (clone with pthread_create's flags
   only), waiting, reading and writing, and what the C library and OpenMP need besides
   (ids, signal masks, a signal action for glibc's own signals only, reading a limit); no
   clock and no affinity; everything else is refused. A refused call traps (SIGSYS) and is reported by
   number (ST_FORBIDDEN_SYSCALL). Each mechanism is reported in the hello as applied, or
   refused with the errno.

   An OpenMP kernel's team is started before the run filter, one thread per CPU this
   process may use, thread t bound to the t-th of them counted from the one the host
   started on (the host's choice; the kernel itself still has no affinity call); a larger
   team's extra threads are made by the first one, on its CPU. Unbound, a team stopped
   and continued between calls woke with two threads on one core about half the time,
   and a timed call took up to twice as long.

   The inputs' pages are read-only here (OP_READ_ONLY, before the first call): a write to
   one faults and is reported by the input's index (ST_INPUT_WRITTEN). The whole arena is
   mapped writable and dirty before the first call (MADV_POPULATE_WRITE), so no call pays a page fault or a dirty-bit update for memory the
   harness set up. MXCSR and the x87 state are reset before and after every call, and a
   change is reported (ST_FP_STATE); 64 KiB of stack below the host's frame are scrubbed
   after every call. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#define KF_MREMAP_DONTUNMAP 4 /* Linux 5.7 */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older C libraries lack the name */
#endif
#define KF_MAX_ARRAYS 16
#define KF_MAX_DIMS 8
#define KF_MAX_GUARDS 64
#define KF_MAGIC 0x6b66686fu /* "kfho" */
#define KF_FIRST_UID 200000
#define KF_MXCSR_DEFAULT 0x1f80u
#define KF_MXCSR_FLAGS 0x3fu /* sticky exception flags: a kernel may set these */
#define KF_X87_DEFAULT 0x037fu

enum { OP_CALL = 1, OP_GUARD = 2, OP_NOP = 3, OP_EXIT = 4, OP_UNGUARD = 5, OP_READ_ONLY = 6 };
enum { ST_OK = 0, ST_FORBIDDEN_SYSCALL = 1, ST_FP_STATE = 2, ST_BAD_COMMAND = 3, ST_INPUT_WRITTEN = 4 };
enum { EXIT_LOAD_FAILED = 90, EXIT_FORBIDDEN = 91, EXIT_SETUP_FAILED = 92 };

/* The mechanisms, in the order kernel_process.MECHANISMS names them. */
enum {
    M_USER_NS, M_PID_NS, M_NET_NS, M_MOUNT_NS, M_IPC_NS, M_UNPRIVILEGED, M_EMPTY_ROOT,
    M_RLIMITS, M_NPROC, M_NO_NEW_PRIVS, M_SECCOMP, M_NO_TSC, M_COUNT
};
#define NOT_TRIED (-1)

struct kf_command {
    uint32_t op;
    uint32_t count;
    uint64_t offsets[KF_MAX_ARRAYS];
    int64_t dims[KF_MAX_DIMS];
    uint64_t guard_offset[KF_MAX_GUARDS];
    uint64_t guard_length[KF_MAX_GUARDS];
};

struct kf_reply {
    uint32_t status;
    uint32_t mxcsr;
    int64_t detail; /* the forbidden call's number, or the x87 control word after a call */
};

struct kf_hello {
    uint32_t magic;
    int32_t mechanisms[M_COUNT]; /* 0 applied, >0 the errno that refused it, -1 not tried */
};

typedef void (*kf_kernel)(void);

static int n_arrays, n_dims;
static unsigned char *arena;
static size_t arena_bytes;

static int write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *data, size_t n) {
    char *p = data;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* The vDSO's code, kept readable (the loader reads its names) but no longer executable,
   with its clock data pages ([vvar]) unmapped: a clock read through the C library jumps
   here and faults, and is reported as the refused clock call it is. */
static uintptr_t vdso_lo, vdso_hi;

/* The inputs' pages (OP_READ_ONLY): read-only here, written only by the driver through
   its own mapping. A write to one faults, and is reported by the index of its range. */
static uint64_t read_only_offset[KF_MAX_GUARDS], read_only_length[KF_MAX_GUARDS];
static uint32_t read_only_count;

static void on_sigsegv(int sig, siginfo_t *info, void *context) {
    (void)context;
    uintptr_t at = (uintptr_t)info->si_addr;
    if (vdso_hi > vdso_lo && at >= vdso_lo && at < vdso_hi) {
        struct kf_reply reply = {ST_FORBIDDEN_SYSCALL, 0, SYS_clock_gettime};
        (void)!write(1, &reply, sizeof reply);
        syscall(SYS_exit_group, EXIT_FORBIDDEN);
    }
    for (uint32_t i = 0; i < read_only_count; ++i) {
        uintptr_t lo = (uintptr_t)arena + read_only_offset[i];
        if (at >= lo && at < lo + read_only_length[i]) {
            struct kf_reply reply = {ST_INPUT_WRITTEN, 0, (int64_t)i};
            (void)!write(1, &reply, sizeof reply);
            syscall(SYS_exit_group, EXIT_FORBIDDEN);
        }
    }
    (void)sig; /* any other fault: the handler is reset (SA_RESETHAND), the instruction runs
                  again and kills the process */
}

static void on_sigsys(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)context;
    struct kf_reply reply = {ST_FORBIDDEN_SYSCALL, 0, info->si_syscall};
    (void)!write(1, &reply, sizeof reply);
    syscall(SYS_exit_group, EXIT_FORBIDDEN);
}

/* --- seccomp ------------------------------------------------------------------------ */

#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i))
#define ARG_HI(i) (offsetof(struct seccomp_data, args) + 8 * (i) + 4)

struct program {
    struct sock_filter code[256];
    unsigned short n;
};

static const uint32_t REFUSE = SECCOMP_RET_TRAP;

static void emit(struct program *p, struct sock_filter f) { p->code[p->n++] = f; }

static void load_nr(struct program *p) {
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)));
}

/* if nr == `nr`: return `action` (continue otherwise) */
static void on_nr(struct program *p, long nr, uint32_t action) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, action));
}

/* if nr == `nr`: allow when (arg `i` & mask) == 0, else `refuse` */
static void on_nr_without_bits(struct program *p, long nr, int i, uint32_t mask, uint32_t refuse) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 4));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(i)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, mask, 1, 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, refuse));
    load_nr(p);
}

/* if nr == `nr`: allow only when arg `i` is 0 (a query, not a change) */
static void on_nr_with_zero_arg(struct program *p, long nr, int i, uint32_t refuse) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 6));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(i)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_HI(i)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, refuse));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    load_nr(p);
}

/* if nr == `nr` and (arg `i` & mask) != 0: refuse; otherwise go on to the next rule */
static void refuse_bits(struct program *p, long nr, int i, uint32_t mask) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, 3));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(i)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, mask, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, REFUSE));
    load_nr(p);
}

/* if nr == `nr` and lo <= arg `i` < hi (64-bit addresses): refuse, unless `key` is not 0
   and arg 3 (an argument the call does not use) holds it; otherwise go on */
static void refuse_in_range(struct program *p, long nr, int i, uint64_t lo, uint64_t hi,
                            uint64_t key) {
    uint32_t lo_hi = (uint32_t)(lo >> 32), lo_lo = (uint32_t)lo;
    uint32_t hi_hi = (uint32_t)(hi >> 32), hi_lo = (uint32_t)hi;
    uint8_t k = key != 0 ? 4 : 0, out = (uint8_t)(11 + k);
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)nr, 0, out));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_HI(i)));             /* 0 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, lo_hi, 3, 0));           /* 1 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, lo_hi, 0, out - 3));     /* 2 */
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(i)));             /* 3 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, lo_lo, 0, out - 5));     /* 4 */
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_HI(i)));             /* 5 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, hi_hi, out - 7, 0));     /* 6 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, hi_hi, 0, 2));           /* 7 */
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(i)));             /* 8 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, hi_lo, out - 10, 0));    /* 9 */
    if (key != 0) { /* in range: the host's own call carries the key */
        emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(3)));         /* 10 */
        emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)key, 0, 2));
        emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_HI(3)));         /* 12 */
        emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(key >> 32), 1, 0));
    }
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, REFUSE));                         /* 10 + k */
    load_nr(p);                                                                              /* out */
}

/* rt_sigaction: a query (no new action), or glibc's own SIGCANCEL and SIGSETXID (32, 33);
   no handler for any signal the harness uses (SIGSYS, SIGSEGV, SIGCONT, SIGXCPU, ...). */
static void on_rt_sigaction(struct program *p) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_rt_sigaction, 0, 9));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0))); /* 0 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 32, 6, 0));  /* 1 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 33, 5, 0));  /* 2 */
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(1))); /* 3 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2));   /* 4 */
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_HI(1))); /* 5 */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0));   /* 6 */
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, REFUSE));             /* 7 */
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));  /* 8 */
    load_nr(p);
}

static void prologue(struct program *p) {
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
    load_nr(p);
    /* the x32 ABI numbers its calls from 0x40000000: none of them is for a kernel */
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP));
}

static int install(struct program *p) {
    struct sock_fprog prog = {p->n, p->code};
    /* every thread, including any the kernel's library started while it loaded */
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
}

/* The flags glibc's pthread_create passes to clone (nptl/pthread_create.c), exit signal 0. */
#define KF_PTHREAD_CLONE_FLAGS                                                                  \
    (CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SYSVSEM | CLONE_SIGHAND | CLONE_THREAD |         \
     CLONE_SETTLS | CLONE_PARENT_SETTID | CLONE_CHILD_CLEARTID)

/* clone makes threads exactly as pthread_create does, and nothing else: no process outlives
   the run, and no CLONE_VFORK leaves a thread waiting where SIGSTOP cannot stop it. The
   whole 64-bit flags word must equal pthread_create's. */
static void on_clone_threads_only(struct program *p) {
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 6));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_HI(0)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 3));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(0)));
    emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, KF_PTHREAD_CLONE_FLAGS, 0, 1));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, REFUSE));
    load_nr(p);
    on_nr(p, SYS_clone3, SECCOMP_RET_ERRNO | ENOSYS); /* glibc then falls back to clone */
}

/* While the kernel's library loads: no new processes, programs, sockets or tracing. */
static int load_filter(void) {
    struct program p = {.n = 0};
    prologue(&p);
    const long denied[] = {SYS_fork, SYS_vfork, SYS_execve, SYS_execveat, SYS_socket,
                           SYS_socketpair, SYS_connect, SYS_ptrace, SYS_kill, SYS_tkill,
                           SYS_process_vm_readv, SYS_process_vm_writev};
    for (size_t i = 0; i < sizeof denied / sizeof *denied; ++i) on_nr(&p, denied[i], REFUSE);
    on_clone_threads_only(&p);
    emit(&p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    return install(&p);
}

/* Once loaded, a kernel computes: memory, threads, waiting. Nothing else: no clock (the
   vDSO is gone, and the clock calls are refused), no affinity of its own, no handler for
   a signal the harness uses, no mapping at an address of its choosing (MAP_FIXED,
   MREMAP_FIXED) and nothing that changes, moves or unmaps the arena or its guard pages
   (which are sealed besides, where Linux has mseal). */
static int run_filter(uint64_t key) {
    struct program p = {.n = 0};
    prologue(&p);
    uint64_t lo = (uint64_t)(uintptr_t)arena, hi = lo + arena_bytes;
    refuse_in_range(&p, SYS_mprotect, 0, lo, hi, key); /* the host's guard pages carry `key` */
    refuse_in_range(&p, SYS_munmap, 0, lo, hi, 0);
    refuse_in_range(&p, SYS_mremap, 0, lo, hi, 0);
    refuse_in_range(&p, SYS_madvise, 0, lo, hi, 0);
    refuse_bits(&p, SYS_mmap, 3, MAP_FIXED | MAP_FIXED_NOREPLACE);
    refuse_bits(&p, SYS_mremap, 3, MREMAP_FIXED | KF_MREMAP_DONTUNMAP);
    const long allowed[] = {
        SYS_read, SYS_write, SYS_munmap, SYS_mremap, SYS_brk, SYS_madvise, SYS_futex,
        SYS_sched_yield, SYS_sched_getaffinity, SYS_getpid, SYS_gettid, SYS_nanosleep,
        SYS_clock_nanosleep, SYS_exit, SYS_exit_group, SYS_rt_sigreturn, SYS_rt_sigprocmask,
        SYS_sigaltstack, SYS_set_robust_list, SYS_rseq, SYS_set_tid_address,
        SYS_restart_syscall, SYS_membarrier, SYS_getrlimit};
    for (size_t i = 0; i < sizeof allowed / sizeof *allowed; ++i)
        on_nr(&p, allowed[i], SECCOMP_RET_ALLOW);
    on_nr_without_bits(&p, SYS_mmap, 2, PROT_EXEC, REFUSE);
    on_nr_without_bits(&p, SYS_mprotect, 2, PROT_EXEC, REFUSE);
    on_nr_with_zero_arg(&p, SYS_prlimit64, 2, REFUSE); /* read a limit, never raise one */
    on_rt_sigaction(&p);
    on_clone_threads_only(&p);
    emit(&p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, REFUSE));
    int rc = install(&p);
    explicit_bzero(&p, sizeof p); /* the key leaves no copy in the kernel's reach */
    return rc;
}

/* --- containment -------------------------------------------------------------------- */

/* No clock in the address space: the [vvar] pages (the kernel's clock data, read by the
   vDSO without a system call) are unmapped, and the [vdso] becomes a read-only copy. */
static int disarm_vdso(void) {
    FILE *maps = fopen("/proc/self/maps", "re");
    if (maps == NULL) return errno ? errno : EPERM;
    char line[512];
    int rc = 0;
    while (fgets(line, sizeof line, maps) != NULL) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
        size_t n = hi - lo;
        if (strstr(line, "[vvar") != NULL) {
            if (munmap((void *)lo, n) != 0) rc = errno;
        } else if (strstr(line, "[vdso]") != NULL) {
            void *copy = malloc(n);
            if (copy == NULL) return ENOMEM;
            memcpy(copy, (void *)lo, n);
            void *at = mmap((void *)lo, n, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (at == MAP_FAILED) {
                rc = errno;
            } else {
                memcpy(at, copy, n);
                if (mprotect(at, n, PROT_READ) != 0) rc = errno;
                vdso_lo = lo;
                vdso_hi = hi;
            }
            free(copy);
        }
    }
    fclose(maps);
    return rc;
}

static int errno_of(int rc) { return rc == 0 ? 0 : (errno ? errno : EPERM); }

static int write_file(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = write_all(fd, text, strlen(text));
    close(fd);
    return rc;
}

/* Namespaces: a user namespace first when not root (so the others are allowed). */
static void enter_namespaces(int *m) {
    uid_t uid = getuid();
    gid_t gid = getgid();
    if (geteuid() != 0) {
        m[M_USER_NS] = errno_of(unshare(CLONE_NEWUSER));
        if (m[M_USER_NS] == 0) {
            char map[64];
            (void)write_file("/proc/self/setgroups", "deny");
            snprintf(map, sizeof map, "0 %u 1\n", (unsigned)uid);
            (void)write_file("/proc/self/uid_map", map);
            snprintf(map, sizeof map, "0 %u 1\n", (unsigned)gid);
            (void)write_file("/proc/self/gid_map", map);
        }
    }
    m[M_NET_NS] = errno_of(unshare(CLONE_NEWNET));
    m[M_IPC_NS] = errno_of(unshare(CLONE_NEWIPC));
    m[M_MOUNT_NS] = errno_of(unshare(CLONE_NEWNS));
    if (m[M_MOUNT_NS] == 0) m[M_MOUNT_NS] = errno_of(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL));
    m[M_PID_NS] = errno_of(unshare(CLONE_NEWPID));
}

/* In a new PID namespace the kernel runs as its init: when it ends, every process left in
   the namespace is killed. This process stays outside, waits, and ends the same way. */
static void become_init_of_pid_namespace(void) {
    int sync[2];
    if (pipe(sync) != 0) _exit(EXIT_SETUP_FAILED);
    pid_t child = fork();
    if (child < 0) _exit(EXIT_SETUP_FAILED);
    if (child == 0) {
        char ignored;
        close(sync[1]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (read(sync[0], &ignored, 1) < 0) _exit(EXIT_SETUP_FAILED); /* EOF: the pid is out */
        close(sync[0]);
        return;
    }
    close(sync[0]);
    int64_t pid = child;
    (void)write_all(1, &pid, sizeof pid);
    close(sync[1]);
    close(0);
    close(1);
    close(3);
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {}
    if (WIFSIGNALED(status)) {
        signal(WTERMSIG(status), SIG_DFL);
        raise(WTERMSIG(status));
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : EXIT_SETUP_FAILED);
}

/* Set a limit, never above what this process was already held to. */
static int cap(int resource, rlim_t value) {
    struct rlimit now;
    if (getrlimit(resource, &now) != 0) return -1;
    if (now.rlim_max != RLIM_INFINITY && value > now.rlim_max) value = now.rlim_max;
    struct rlimit wanted = {value, value};
    return setrlimit(resource, &wanted);
}

static int set_limits(unsigned long long address_space, unsigned long long cpu_seconds) {
    signal(SIGXFSZ, SIG_IGN);
    /* no core files; the log file is the only file, and takes 1 MiB */
    int rc = cap(RLIMIT_CORE, 0) | cap(RLIMIT_FSIZE, 1 << 20) | cap(RLIMIT_AS, address_space) |
             cap(RLIMIT_CPU, cpu_seconds);
    return rc == 0 ? 0 : (errno ? errno : EPERM);
}

/* An empty root, read-only: nothing on the host's file system can be seen from here. */
static int enter_empty_root(const char *root) {
    if (mount(root, root, NULL, MS_BIND, NULL) == 0)
        (void)mount(NULL, root, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    if (chdir(root) != 0 || chroot(".") != 0 || chdir("/") != 0) return errno ? errno : EPERM;
    return 0;
}

/* Root becomes a user of its own (uid and gid KF_FIRST_UID + pid), so RLIMIT_NPROC counts
   this process's threads alone: enough for one OpenMP team, and no more. */
static void drop_privileges(int *m, uid_t own_id) {
    if (geteuid() != 0 || m[M_USER_NS] == 0) {
        m[M_UNPRIVILEGED] = 0; /* started unprivileged: a user namespace grants nothing outside */
        m[M_NPROC] = EPERM;    /* it would count every process of the invoking user */
        return;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    rlim_t tasks = (rlim_t)(cores > 0 ? 2 * cores + 8 : 16);
    struct rlimit nproc = {tasks, tasks};
    m[M_NPROC] = errno_of(setrlimit(RLIMIT_NPROC, &nproc));
    if (setgroups(0, NULL) != 0 || setgid(own_id) != 0 || setuid(own_id) != 0) {
        m[M_UNPRIVILEGED] = errno ? errno : EPERM;
        return;
    }
    m[M_UNPRIVILEGED] = getuid() == 0 ? EPERM : 0;
}

/* --- the calls ------------------------------------------------------------------------ */

static void __attribute__((noinline)) scrub_stack(void) {
    volatile unsigned char below[64 << 10];
    memset((void *)below, 0, sizeof below);
    __asm__ volatile("" : : "r"(below) : "memory");
}

typedef void (*kf_call24)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                          uint64_t, uint64_t, uint64_t);

static uint32_t call_kernel(kf_kernel fn, const struct kf_command *c, uint16_t *x87) {
    /* The pointers, then the dims, as the kernel's prototype lists them. Every argument is
       an integer-class 8-byte value, so under the System V ABI each lands where the
       kernel looks for it, and the unused trailing ones are ignored by the callee. */
    uint64_t a[KF_MAX_ARRAYS + KF_MAX_DIMS] = {0};
    for (int i = 0; i < n_arrays; ++i) a[i] = (uint64_t)(uintptr_t)(arena + c->offsets[i]);
    for (int i = 0; i < n_dims; ++i) a[n_arrays + i] = (uint64_t)c->dims[i];
    uint32_t after = KF_MXCSR_DEFAULT;
    *x87 = KF_X87_DEFAULT;
#if defined(__x86_64__)
    _mm_setcsr(KF_MXCSR_DEFAULT);
    __asm__ volatile("fninit");
#endif
    ((kf_call24)fn)(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                    a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21],
                    a[22], a[23]);
#if defined(__x86_64__)
    after = _mm_getcsr();
    __asm__ volatile("fnstcw %0" : "=m"(*x87));
    _mm_setcsr(KF_MXCSR_DEFAULT);
    __asm__ volatile("fninit");
#endif
    scrub_stack();
    return after;
}

static int valid_call(const struct kf_command *c) {
    for (int i = 0; i < n_arrays; ++i)
        if (c->offsets[i] >= arena_bytes) return 0;
    return 1;
}

/* The key the driver sends with guard commands (in dims[0]), which the run filter
   requires of an mprotect in the arena: held here only until the filter is built. */
static uint64_t guard_key;

static int protect(void *at, size_t n, int prot, uint64_t key) {
    return (int)syscall(SYS_mprotect, at, n, prot, key);
}

static int guard(const struct kf_command *c, int prot) {
    for (uint32_t i = 0; i < c->count && i < KF_MAX_GUARDS; ++i) {
        if (c->guard_offset[i] + c->guard_length[i] > arena_bytes) return -1;
        if (protect(arena + c->guard_offset[i], c->guard_length[i], prot,
                    (uint64_t)c->dims[0]) != 0)
            return -1;
    }
    return 0;
}

static int read_only(const struct kf_command *c) {
    if (guard(c, PROT_READ) != 0) return -1;
    read_only_count = 0;
    for (uint32_t i = 0; i < c->count && i < KF_MAX_GUARDS; ++i) {
        read_only_offset[i] = c->guard_offset[i];
        read_only_length[i] = c->guard_length[i];
    }
    read_only_count = c->count < KF_MAX_GUARDS ? c->count : KF_MAX_GUARDS;
    return 0;
}

/* --- the OpenMP team, bound before the kernel runs ------------------------------------ */

typedef void (*kf_gomp_parallel)(void (*)(void *), void *, unsigned, unsigned);
static int (*team_thread_number)(void);
static cpu_set_t usable_cpus;
static int first_cpu_index; /* of the CPU the host started on, among the usable ones */

/* The usable CPU at `index` (modulo their count). */
static int usable_cpu(int index) {
    int wanted = index % CPU_COUNT(&usable_cpus);
    for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu)
        if (CPU_ISSET(cpu, &usable_cpus) && seen++ == wanted) return cpu;
    return -1;
}

static void bind_team_thread(void *unused) {
    (void)unused;
#if defined(__x86_64__)
    /* as every call starts on the host's thread (a -ffast-math library's constructor set
       flush-to-zero on it while it loaded, and new threads inherit that) */
    _mm_setcsr(KF_MXCSR_DEFAULT);
    __asm__ volatile("fninit");
#endif
    int cpu = usable_cpu(first_cpu_index + team_thread_number());
    if (cpu < 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(0, sizeof one, &one);
}

/* Starts the team the kernel's parallel regions will reuse (libgomp keeps its threads),
   thread t bound to the t-th usable CPU counted from the one the host started on (where
   the scheduler placed it: hosts started side by side, one thread each, stay spread),
   so the scheduler cannot wake two of them on one core. A kernel without OpenMP has no
   team to bind. */
static void bind_openmp_team(void *library) {
    kf_gomp_parallel parallel = (kf_gomp_parallel)dlsym(library, "GOMP_parallel");
    team_thread_number = (int (*)(void))dlsym(library, "omp_get_thread_num");
    unsigned here = 0;
    if (parallel == NULL || team_thread_number == NULL ||
        sched_getaffinity(0, sizeof usable_cpus, &usable_cpus) != 0)
        return;
    if (syscall(SYS_getcpu, &here, NULL, NULL) == 0)
        for (unsigned cpu = 0; cpu < here && cpu < CPU_SETSIZE; ++cpu)
            first_cpu_index += CPU_ISSET(cpu, &usable_cpus) ? 1 : 0;
    parallel(bind_team_thread, NULL, 0, 0);
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s LIBRARY N_ARRAYS N_DIMS AS_BYTES CPU_SECONDS ROOT\n", argv[0]);
        return 2;
    }
    n_arrays = atoi(argv[2]);
    n_dims = atoi(argv[3]);
    if (n_arrays < 1 || n_arrays > KF_MAX_ARRAYS || n_dims < 0 || n_dims > KF_MAX_DIMS) {
        fprintf(stderr, "too many arrays or dims\n");
        return 2;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* Nothing the driver's process happened to hold open comes along: only 0-3. */
    if (syscall(SYS_close_range, 4u, ~0u, 0u) != 0)
        for (long fd = 4, top = sysconf(_SC_OPEN_MAX); fd < top && fd < 65536; ++fd) close((int)fd);
    struct kf_hello hello = {.magic = KF_MAGIC};
    for (int i = 0; i < M_COUNT; ++i) hello.mechanisms[i] = NOT_TRIED;
    uid_t own_id = KF_FIRST_UID + (uid_t)(getpid() % 100000);
    enter_namespaces(hello.mechanisms);
    if (hello.mechanisms[M_PID_NS] == 0) {
        become_init_of_pid_namespace();
    } else {
        int64_t pid = getpid();
        if (write_all(1, &pid, sizeof pid) != 0) return EXIT_SETUP_FAILED;
    }
    struct stat st;
    if (fstat(3, &st) != 0 || st.st_size <= 0) {
        fprintf(stderr, "no arena on fd 3\n");
        return EXIT_SETUP_FAILED;
    }
    arena_bytes = (size_t)st.st_size;
    /* Every page mapped now, writable and dirty, before any call: no call pays for mapping
       the harness's memory (a fault, or the first write's dirty-bit update, per 4 KiB),
       however many input sets timing rotates over. Before Linux 5.14, mapped clean. */
    arena = mmap(NULL, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, 3, 0);
    if (arena != MAP_FAILED && madvise(arena, arena_bytes, MADV_POPULATE_WRITE) != 0) {
        munmap(arena, arena_bytes);
        arena = mmap(NULL, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, 3, 0);
    }
    if (arena == MAP_FAILED) {
        perror("mmap arena");
        return EXIT_SETUP_FAILED;
    }
    close(3);
    /* The time-stamp counter faults: no clock of its own, whatever instructions it holds. */
    hello.mechanisms[M_NO_TSC] = errno_of(prctl(PR_SET_TSC, PR_TSC_SIGSEGV, 0, 0, 0));
    struct sigaction on_sys = {.sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO};
    sigaction(SIGSYS, &on_sys, NULL);
    struct sigaction on_segv = {.sa_sigaction = on_sigsegv,
                                .sa_flags = SA_SIGINFO | SA_RESETHAND};
    sigaction(SIGSEGV, &on_segv, NULL);
    if (disarm_vdso() != 0) {
        fprintf(stderr, "the vDSO could not be disarmed\n");
        return EXIT_SETUP_FAILED;
    }
    hello.mechanisms[M_NO_NEW_PRIVS] = errno_of(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0));
    int load_guard = hello.mechanisms[M_NO_NEW_PRIVS] == 0 ? errno_of(load_filter()) : EPERM;
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fprintf(stderr, "the kernel did not load: %s\n", dlerror());
        return EXIT_LOAD_FAILED;
    }
    kf_kernel fn = (kf_kernel)dlsym(library, "kernel");
    if (fn == NULL) {
        fprintf(stderr, "the kernel library has no symbol 'kernel'\n");
        return EXIT_LOAD_FAILED;
    }
    bind_openmp_team(library);
    hello.mechanisms[M_RLIMITS] = set_limits(strtoull(argv[4], NULL, 10), strtoull(argv[5], NULL, 10));
    hello.mechanisms[M_EMPTY_ROOT] = enter_empty_root(argv[6]);
    drop_privileges(hello.mechanisms, own_id);
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a change of credentials clears it: armed again */
    /* the run filter comes with the first call, once the driver has set the guard pages */
    hello.mechanisms[M_SECCOMP] = load_guard;
    if (write_all(1, &hello, sizeof hello) != 0) return EXIT_SETUP_FAILED;

    struct kf_command command;
    int filtered = 0;
    while (read_all(0, &command, sizeof command) == 0) {
        struct kf_reply reply = {ST_OK, KF_MXCSR_DEFAULT, 0};
        if ((command.op == OP_GUARD || command.op == OP_UNGUARD || command.op == OP_READ_ONLY) &&
            !filtered)
            guard_key = (uint64_t)command.dims[0];
        if (command.op == OP_CALL && !filtered) {
            /* The guard pages are set: from the first call on, nothing but the host (with
               the key) changes the arena's mappings or protections. */
            filtered = 1;
            uint64_t key = guard_key;
            guard_key = 0;
            if (load_guard == 0 && run_filter(key) != 0) return EXIT_SETUP_FAILED;
        }
        if (command.op == OP_CALL && valid_call(&command)) {
            uint16_t x87;
            reply.mxcsr = call_kernel(fn, &command, &x87);
            reply.detail = x87;
            if ((reply.mxcsr & ~KF_MXCSR_FLAGS) != (KF_MXCSR_DEFAULT & ~KF_MXCSR_FLAGS) ||
                x87 != KF_X87_DEFAULT)
                reply.status = ST_FP_STATE;
        } else if (command.op == OP_GUARD) {
            if (guard(&command, PROT_NONE) != 0) reply.status = ST_BAD_COMMAND;
        } else if (command.op == OP_READ_ONLY) {
            if (read_only(&command) != 0) reply.status = ST_BAD_COMMAND;
        } else if (command.op == OP_UNGUARD) {
            read_only_count = 0;
            if (protect(arena, arena_bytes, PROT_READ | PROT_WRITE, (uint64_t)command.dims[0]) != 0)
                reply.status = ST_BAD_COMMAND;
        } else if (command.op == OP_EXIT) {
            break;
        } else if (command.op != OP_NOP) {
            reply.status = ST_BAD_COMMAND;
        }
        explicit_bzero(command.dims, sizeof command.dims); /* a guard command's key */
        if (write_all(1, &reply, sizeof reply) != 0) break;
    }
    syscall(SYS_exit_group, 0);
    return 0;
}
