"""Device back ends and the rules that judge kernels; imports only `kernels`.

verifier     verification stages and rules (device-independent)
benchmarker  timing statistics and the checks only timing can make (device-independent)
results      the frozen result structs: Verdict, Rejection, BenchmarkResult, HostCalibration
sandbox      runs untrusted code in a limited child process
cpu/         the CPU target: compiler, static checks, sandboxed runner, host calibration
"""
