"""Measure the GPU's ceilings once and cache them per GPU: the roofline of CUDA kernels.

Measured in the sandboxed CUDA child (gpu_workers.cuda.runner), never in the worker:
- memory bandwidth: a device-to-device copy of COPY_BYTES (cuMemcpyDtoD), best of
  several by CUDA events, bytes read plus bytes written;
- compute: a library matmul (torch, else cupy; cuBLAS either way) of MATMUL_N^3 in fp32
  with TF32 off, bf16 and fp16; 2 n^3 flops over the best time. Only a library the device
  probe found working with CUDA is used; with neither, measuring refuses with the reason
  (device.benchmark_unavailable_reason, which a benchmarker checks before it starts).

HostCalibration was written for CPUs; for a GPU its fields mean: host =
"hostname:GPU name:index", cpu_model = the GPU's name, cores = its SM count, llc_bytes =
its L2 size, memory_bandwidth_gbs = numpy_copy_bandwidth_gbs = the copy figure (there is
no second copy method), peak_fp32_gflops = sgemm_gflops = fma_peak_gflops = the fp32
matmul figure (no separate FMA kernel is run), peak_gflops_by_dtype = every dtype's
matmul figure, streaming_stores = False.
"""

from __future__ import annotations

import datetime
import hashlib
import socket
from pathlib import Path

from gpu_workers.cache_root import cache_root
from gpu_workers.calibration_cache import cached_calibration
from gpu_workers.cuda import protocol as p
from gpu_workers.cuda.backend import RUNNER, UNLIMITED
from gpu_workers.cuda.device import (
    DeviceInfo,
    calibration_unavailable_reason,
    cuda_env,
    device_index,
    require_gpu,
)
from gpu_workers.held_folder import held_folder
from gpu_workers.results import HostCalibration
from gpu_workers.runner_files import read_reply, write_request
from gpu_workers.sandbox import Limits, run_sandboxed
from gpu_workers.sandbox_outcome import contention

COPY_BYTES = 1 << 30
MATMUL_N = 8192
REPEATS = 10
DTYPES = ("fp32", "bf16", "fp16")
CALIBRATE_LIMITS = Limits(
    cpu_seconds=1200, address_space_bytes=UNLIMITED, wall_seconds=600.0, file_size_bytes=64 << 20
)


class CalibrationError(RuntimeError):
    """The GPU could not be measured; the message says why."""


def gpu_key(info: DeviceInfo) -> str:
    identity = f"{socket.gethostname()}|{info.name}|{info.pci_bus_id}|{device_index()}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def calibration_path(cache_dir: Path | None = None) -> Path:
    """Where this worker's GPU's calibration is cached (NoGpu without a GPU)."""
    base = cache_dir or cache_root()
    return base / f"gpu-calibration-{gpu_key(require_gpu())}.json"


def load_or_calibrate(cache_dir: Path | None = None, *, force: bool = False) -> HostCalibration:
    """The cached calibration of this worker's GPU, measuring it first if there is none."""
    return cached_calibration(calibration_path(cache_dir), measure, force=force)


def matmul_library(info: DeviceInfo) -> str:
    """The library whose matmul measures the compute peak: torch, else cupy, each only if
    it works with CUDA here; CalibrationError with the reason when neither does."""
    reason = calibration_unavailable_reason(info)
    if reason is not None:
        raise CalibrationError(reason)
    return "torch" if info.torch.usable else "cupy"


def measure() -> HostCalibration:
    job = p.CalibrateJob(
        copy_bytes=COPY_BYTES,
        matmul_n=MATMUL_N,
        dtypes=list(DTYPES),
        matmul_library=matmul_library(require_gpu()),
        repeats=REPEATS,
    )
    with held_folder("kf-cuda-calibrate-") as workdir:
        write_request(workdir, job)
        outcome = run_sandboxed(
            RUNNER, [], workdir=workdir, limits=CALIBRATE_LIMITS, env=cuda_env()
        )
        reply = read_reply(workdir, p.Reply)
    if reply is None:
        raise CalibrationError(
            f"GPU calibration gave no result (exit {outcome.returncode}, "
            f"{outcome.signal_name}, timed out: {outcome.timed_out}): "
            f"{outcome.stderr[-2000:]}"
        )
    if isinstance(reply, p.FaultReply):
        raise CalibrationError(f"GPU calibration failed: {reply.message}; {reply.evidence}")
    if not outcome.ok or not isinstance(reply, p.CalibrateReply):
        raise CalibrationError(
            f"GPU calibration failed (exit {outcome.returncode}): {outcome.stderr[-2000:]}"
        )
    return _calibration(reply, contention(outcome))


def _calibration(reply: p.CalibrateReply, busy: float | None) -> HostCalibration:
    flops = 2.0 * reply.matmul_n**3
    peaks = {dtype: flops / seconds / 1e9 for dtype, seconds in reply.matmul_seconds.items()}
    if "fp32" not in peaks:
        raise CalibrationError(f"no fp32 matmul was measured ({reply.matmul_library})")
    notes = ""
    if "bf16" not in peaks and "fp16" in peaks:
        # Every NVIDIA GPU with bf16 tensor cores runs bf16 and fp16 at one dense rate.
        peaks["bf16"] = peaks["fp16"]
        notes = "; bf16 not measured (no bfloat16 in the library), taken as the fp16 figure"
    copy_gbs = reply.copy_bytes / reply.copy_seconds / 1e9
    return HostCalibration(
        host=f"{socket.gethostname()}:{reply.device_name}:{device_index()}",
        cpu_model=reply.device_name,
        cores=reply.sm_count,
        llc_bytes=reply.l2_bytes,
        memory_bandwidth_gbs=copy_gbs,
        numpy_copy_bandwidth_gbs=copy_gbs,
        peak_fp32_gflops=peaks["fp32"],
        sgemm_gflops=peaks["fp32"],
        fma_peak_gflops=peaks["fp32"],
        streaming_stores=False,
        host_contention_cores=busy,
        measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        method=(
            f"GPU {reply.device_name} ({reply.pci_bus_id}, {reply.sm_count} SMs, "
            f"L2 {reply.l2_bytes >> 20} MiB): best of {REPEATS} by CUDA events; "
            f"cuMemcpyDtoD of {reply.copy_bytes // 2 >> 20} MiB (bytes read + written); "
            f"{reply.matmul_library} at {reply.matmul_n}^3 per dtype; fields: cores = SMs, "
            "llc = L2, both copy figures = the device copy, fp32 peak = sgemm = fma = the "
            f"fp32 matmul{notes}"
        ),
        peak_gflops_by_dtype=peaks,
    )
