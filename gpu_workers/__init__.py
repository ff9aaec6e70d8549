"""Device back ends and the rules that judge kernels; imports only `kernels`.

verifier           verification stages and rules (device-independent)
benchmarker        timing statistics and the checks only timing can make (device-independent)
results            the frozen result structs: Verdict, Rejection, BenchmarkResult, HostCalibration
sandbox            runs untrusted code in a limited child process
compiler_process   a compiler run on untrusted source (capped, its children killed on timeout)
interleave         the timing loop every runner shares

What both back ends share:
build_cache        the content-keyed cache of builds (key, entry folder, meta.json)
compile_failure    CompileFailure and the compile-stage rejection it becomes
runner_files       the files between a worker and its sandboxed runner, reading the reply
sandbox_outcome    a runner that did not finish as a rejection; the host's contention
calibration_cache  a device's ceilings measured once; cache_root where rebuildable things go
atomic_file        whole-file replacement

cpu/               the CPU target: compiler, static checks, sandboxed runner, host calibration
cuda/              the CUDA target: nvcc and the ptxas report, per-arch limits, static checks,
                   the device probe, the pycuda runner, baselines, the GPU roofline
"""
