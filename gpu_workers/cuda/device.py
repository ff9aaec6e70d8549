"""Is there a usable CUDA GPU here, and which one? Asked of a short child process.

The worker process never initialises CUDA itself: a context created there would be
shared by nothing and poisoned by the first faulting kernel. A child answers once per
process (the answer is cached): driver present, device present, pycuda importable, the
device's name, compute capability and PCI bus id, and whether torch and cupy work with
CUDA here (the baselines and the calibration's matmul need one of them).

Two refusals follow from the answer, each a reason for a human or None:
`gpu_unavailable_reason` (no GPU to run kernels on, or one of an architecture kfactory
has no limits for) and `benchmark_unavailable_reason` (that, or no library to calibrate
the GPU's compute peak with).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import msgspec

from gpu_workers.cuda.arch import ARCHES

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


class Library(msgspec.Struct, frozen=True, kw_only=True):
    """An array library as the probe found it."""

    usable: bool
    """It imports and works with this GPU (torch: torch.cuda.is_available(); cupy: it
    sees a device)."""
    note: str
    """Its name and version when usable, else why not."""


NOT_PROBED = Library(usable=False, note="not probed")


class DeviceInfo(msgspec.Struct, frozen=True, kw_only=True):
    reason: str | None
    """None when the probe found a GPU and pycuda, else why not, for a human."""
    name: str = ""
    compute_capability: tuple[int, int] = (0, 0)
    pci_bus_id: str = ""
    torch: Library = NOT_PROBED
    cupy: Library = NOT_PROBED


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

def library(name, works):
    try:
        module = __import__(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return {"usable": False, "note": f"{name} is not installed"}
        return {"usable": False, "note": f"{name} failed to import: {exc}"}
    except Exception as exc:
        return {"usable": False, "note": f"{name} failed to import: {type(exc).__name__}: {exc}"}
    label = f"{name} {getattr(module, '__version__', '(no version)')}"
    try:
        why = works(module)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
    if why:
        return {"usable": False, "note": f"{label}: {why}"}
    return {"usable": True, "note": label}

def torch_works(torch):
    if torch.version.cuda is None:
        return "a build without CUDA"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None

def cupy_works(cupy):
    if cupy.cuda.runtime.getDeviceCount() < 1:
        return "it sees no CUDA device"
    return None

say(
    reason=None,
    name=dev.name(),
    compute_capability=list(dev.compute_capability()),
    pci_bus_id=dev.pci_bus_id(),
    torch=library("torch", torch_works),
    cupy=library("cupy", cupy_works),
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


def unavailable_reason(info: DeviceInfo) -> str | None:
    """Why kernels cannot run on the GPU `info` describes, or None: no GPU or pycuda, or
    an architecture without a row in gpu_workers.cuda.arch (every compile for it would
    fail)."""
    if info.reason is not None:
        return info.reason
    arch = arch_of(info)
    if arch not in ARCHES:
        return (
            f"this GPU ({info.name}) is {arch}; kfactory knows {', '.join(ARCHES)} "
            "(add its limits to gpu_workers/cuda/arch.py)"
        )
    return None


def calibration_unavailable_reason(info: DeviceInfo) -> str | None:
    """Why the GPU's compute peak cannot be measured, or None: the calibration times a
    library matmul, and needs torch or cupy working with CUDA."""
    if info.torch.usable or info.cupy.usable:
        return None
    return (
        f"GPU calibration needs torch or cupy with CUDA: {info.torch.note}; {info.cupy.note} "
        "(install a CUDA build of torch, or cupy for this CUDA version)"
    )


def gpu_unavailable_reason() -> str | None:
    """None when kernels can run on this host's GPU, else why not."""
    return unavailable_reason(probe())


def benchmark_unavailable_reason() -> str | None:
    """None when kernels can also be timed against the calibrated roofline here, else why
    not."""
    info = probe()
    return unavailable_reason(info) or calibration_unavailable_reason(info)


def require_gpu() -> DeviceInfo:
    info = probe()
    reason = unavailable_reason(info)
    if reason is not None:
        raise NoGpu(reason)
    return info


def cuda_libraries() -> frozenset[str]:
    """The array libraries that work with this host's GPU ("torch", "cupy")."""
    info = probe()
    return frozenset(n for n, lib in (("torch", info.torch), ("cupy", info.cupy)) if lib.usable)


def arch_of(info: DeviceInfo) -> str:
    major, minor = info.compute_capability
    return f"sm_{major}{minor}"


def device_arch() -> str:
    """The visible device's architecture for nvcc, e.g. "sm_90"; NoGpu without one."""
    return arch_of(require_gpu())


def device_index() -> str:
    """Which of the host's GPUs this worker uses, as CUDA_VISIBLE_DEVICES names it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "0"
