"""Is there a usable CUDA GPU here, and which one? Asked of a short child process.

The worker process never initialises CUDA itself: a context created there would be
shared by nothing and poisoned by the first faulting kernel. A child answers once per
process (the answer is cached): driver present, device present, pycuda importable, and
the device's name, compute capability, L2 size and SM count.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import msgspec

PROBE_TIMEOUT_S = 120.0
INSTALL_HINT = "pip install 'kernel-factory[cuda]'"
CUDA_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
)
"""Environment a CUDA child needs from the worker (the sandbox scrubs the rest): which GPU
is this worker's, and where the driver and toolkit libraries are."""


class NoGpu(RuntimeError):
    """No usable CUDA GPU on this host; the message says why. Never a kernel's fault."""


class DeviceInfo(msgspec.Struct, frozen=True, kw_only=True):
    reason: str | None
    """None when a GPU is usable, else why not, for a human."""
    name: str = ""
    compute_capability: tuple[int, int] = (0, 0)
    pci_bus_id: str = ""
    l2_bytes: int = 0
    sm_count: int = 0
    total_memory_bytes: int = 0
    driver_version: int = 0


# Runs in the child. Driver first (ctypes, no context is created by cuInit or by the
# device queries), then pycuda, so the reason named is the most basic one missing.
_PROBE = r"""
import ctypes, json, sys

def say(**fields):
    print(json.dumps(fields))
    sys.exit(0)

def error_name(lib, code):
    text = ctypes.c_char_p()
    if lib.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
        return text.value.decode()
    return f"error {code}"

try:
    lib = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    say(reason=f"no CUDA driver (libcuda.so not found: {exc})")
code = lib.cuInit(0)
if code == 100:
    say(reason="no CUDA device (the driver found none)")
if code != 0:
    say(reason=f"the CUDA driver failed to initialise: cuInit returned {error_name(lib, code)}")
count = ctypes.c_int(0)
code = lib.cuDeviceGetCount(ctypes.byref(count))
if code != 0 or count.value == 0:
    say(reason="no CUDA device (the driver lists none)")
try:
    import pycuda.driver as cuda
except ModuleNotFoundError as exc:
    if exc.name == "pycuda":
        say(reason="pycuda is not installed (%s)" % sys.argv[1])
    say(reason=f"pycuda failed to import: {exc}")
except ImportError as exc:
    say(reason=f"pycuda failed to import (built for another CUDA?): {exc}")
cuda.init()
dev = cuda.Device(0)
attr = cuda.device_attribute
say(
    reason=None,
    name=dev.name(),
    compute_capability=list(dev.compute_capability()),
    pci_bus_id=dev.pci_bus_id(),
    l2_bytes=dev.get_attribute(attr.L2_CACHE_SIZE),
    sm_count=dev.get_attribute(attr.MULTIPROCESSOR_COUNT),
    total_memory_bytes=dev.total_memory(),
    driver_version=cuda.get_driver_version(),
)
"""


def cuda_env() -> dict[str, str]:
    """The worker's CUDA-related environment, to pass to a sandboxed CUDA child."""
    return {k: os.environ[k] for k in CUDA_ENV if k in os.environ}


@functools.cache
def probe() -> DeviceInfo:
    """What the child found (cached for the life of this process)."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, INSTALL_HINT],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return DeviceInfo(reason=f"the CUDA probe gave no answer within {PROBE_TIMEOUT_S:g} s")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return DeviceInfo(reason=f"the CUDA probe failed (exit status {done.returncode}): {tail}")
    try:
        return msgspec.json.decode(lines[-1], type=DeviceInfo)
    except msgspec.DecodeError as exc:
        return DeviceInfo(reason=f"the CUDA probe answered nonsense ({exc}): {lines[-1]!r}")


def gpu_unavailable_reason() -> str | None:
    """None when pycuda imports and a CUDA device is present, else why not."""
    return probe().reason


def require_gpu() -> DeviceInfo:
    info = probe()
    if info.reason is not None:
        raise NoGpu(info.reason)
    return info


def device_arch() -> str:
    """The visible device's architecture for nvcc, e.g. "sm_90"; NoGpu without one."""
    major, minor = require_gpu().compute_capability
    return f"sm_{major}{minor}"


def device_index() -> str:
    """Which of the host's GPUs this worker uses, as CUDA_VISIBLE_DEVICES names it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"
