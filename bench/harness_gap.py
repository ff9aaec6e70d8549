"""How much slower the factory's timing finds a softmax kernel than a warm harness, and why.

The factory times each call of a kernel in a sandboxed process of its own, on arrays in a
shared arena (a memfd), with fresh inputs and poisoned outputs written before every call
and every cache flushed. The neutral harness (bench/native_harness.py, which
bench/softmax_limit.py uses) calls the kernel in this process on numpy's arrays, caches
flushed, inputs rotating over two sets. This bench times the same kernels:

- neutral: the neutral harness as softmax_limit runs it;
- shared: its arrays in shared memory, as the arena holds them (4 KiB pages on a host
  whose shared memory takes no transparent huge pages);
- fresh: fresh inputs and poisoned outputs written before each call, then flushed;
- shared + fresh: both;
- factory: the factory's own timing run (`gpu_workers.targets.compile_and_time`).

The four neutral ways and the kernels are interleaved round by round (each round calls
every kernel in every way, the order rotating); the factory's runs follow. Each figure
is the median over the calls. At 4096x4096 on a 2-core AVX2 EPYC the factory's figure was
55-82% above the neutral one while the kernel host left its OpenMP threads to the
scheduler, and 2-32% above once it bound them one per CPU.

Usage: python bench/harness_gap.py [--kernel FILE ...] [--rounds 15]
(default: softmax_rows' best known point; a FILE has a `// kfactory-flags: ...` line, as
`kfactory best` writes it). Prints a table; writes bench/results/harness_gap.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from native_harness import Workload, compile_library, kernel_file  # noqa: E402

from gpu_workers.results import BenchmarkResult  # noqa: E402
from gpu_workers.targets import calibration_for, compile_and_time  # noqa: E402
from kernels.builtin import BUILTIN  # noqa: E402
from kernels.templates import TEMPLATES  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SHAPE = {"rows": 4096, "cols": 4096}
WAYS = {"neutral": (False, False), "shared": (True, False), "fresh": (False, True)}
WAYS["shared + fresh"] = (True, True)
POISON = np.uint32(0x7FC00001)


def kernels_to_time(files: list[Path]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name: (source, flags) of each kernel file, or of softmax_rows' best known point."""
    if not files:
        template = TEMPLATES["softmax_rows"]
        rendered = template.render(dict(template.best_known))
        return {"best_known_point": (rendered.source, tuple(rendered.flags))}
    return {path.stem: kernel_file(path) for path in files}


def neutral_times(
    kernels: dict[str, tuple[str, tuple[str, ...]]], rounds: int
) -> dict[str, dict[str, float]]:
    """Median ms per kernel and way, every way and kernel once per round (the host's
    memory changes speed between modes, and this keeps every way in the same ones)."""
    workloads = {
        way: Workload(BUILTIN["softmax"], SHAPE, sets=2, shared=shared)
        for way, (shared, _) in WAYS.items()
    }
    rng = np.random.default_rng(7)
    fresh_x = [rng.standard_normal((SHAPE["rows"], SHAPE["cols"]), np.float32) for _ in range(2)]
    calls = {}
    for name, (source, flags) in kernels.items():
        function = ctypes.CDLL(str(compile_library(f"gap_{name}", source, flags))).kernel
        function.restype = None
        calls[name] = function
    samples: dict[tuple[str, str], list[float]] = {
        (way, name): [] for way in WAYS for name in calls
    }
    order = list(samples)
    for r in range(rounds + 2):
        for k in range(len(order)):
            way, name = order[(r + k) % len(order)]
            workload, i = workloads[way], r % 2
            if WAYS[way][1]:
                np.copyto(workload.inputs[i]["x"], fresh_x[(r + 1) % 2])
                workload.outputs["y"].view(np.uint32)[...] = POISON
            workload.flush(i)
            started = time.perf_counter_ns()
            calls[name](*workload.args(i))
            if r >= 2:
                samples[(way, name)].append((time.perf_counter_ns() - started) / 1e6)
    table: dict[str, dict[str, float]] = {name: {} for name in calls}
    for (way, name), values in samples.items():
        table[name][way] = statistics.median(values)
    return table


def factory_time(source: str, flags: tuple[str, ...]) -> float:
    result = compile_and_time(
        "cpu",
        BUILTIN["softmax"],
        source,
        flags,
        "fp32",
        calibration=calibration_for("cpu"),
        shape=SHAPE,
    )
    if not isinstance(result, BenchmarkResult):
        raise SystemExit(f"the factory's timing refused the kernel: {result}")
    return result.kernel.median_ns / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", type=Path, action="append", default=[])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, default=RESULTS / "harness_gap.json")
    args = parser.parse_args()
    kernels = kernels_to_time(args.kernel)
    table = neutral_times(kernels, args.rounds)
    print("neutral ways: done; the factory's timing runs next", file=sys.stderr, flush=True)
    for name, (source, flags) in kernels.items():
        table[name]["factory"] = factory_time(source, flags)
    columns = [*WAYS, "factory"]
    print(f"{'kernel (median ms)':40s}" + "".join(f"{c:>16s}" for c in columns))
    for name, row in table.items():
        print(f"{name:40s}" + "".join(f"{row[c]:16.2f}" for c in columns))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"shape": SHAPE, "median_ms": table}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
