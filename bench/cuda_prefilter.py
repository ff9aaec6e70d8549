"""The cuda pre-filter on a host without a GPU: what the compile and static stages refuse.

Usage:
  .venv/bin/python bench/cuda_prefilter.py                 # 16 points per template and dtype
  .venv/bin/python bench/cuda_prefilter.py --points 40 --seed 2

For every CUDA template and fusion space, and every dtype it is written for, a seeded
sample of its valid points goes through the cuda back end's compile and static stages
(nvcc for sm_90, the ptxas report, the architecture's limits), as the `compiler` role
does for each candidate. The table says how many passed, what the rest were refused for,
and the compile time and registers of those that passed: the GPU time a laptop saves.
Prints a table; writes bench/results/cuda_prefilter.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from gpu_workers.cuda.backend import CudaBackend
from gpu_workers.cuda.nvcc import CudaBuild
from gpu_workers.verification import precheck
from kernels.builtin import BUILTIN
from kernels.design_space import TARGET_DTYPES, Template
from kernels.fusion import fusion_space
from kernels.templates import templates_for

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def spaces() -> list[Template]:
    found: list[Template] = []
    for name, problem in sorted(BUILTIN.items()):
        found += templates_for(name, "cuda")
        if problem.graph:
            found.append(fusion_space(problem, "cuda"))
    return found


def one(
    backend: CudaBackend, template: Template, dtype: str, params: dict[str, Any]
) -> dict[str, Any]:
    rendered = template.render(params, dtype)
    started = time.perf_counter()
    outcome = precheck(BUILTIN[template.problem], backend, rendered.source, rendered.flags, dtype)
    seconds = time.perf_counter() - started
    if outcome.rejection is not None:
        return {"passed": False, "reason": f"{outcome.rejection.stage}/{outcome.rejection.reason}"}
    build = outcome.build
    assert isinstance(build, CudaBuild)
    registers = max(r.registers for r in build.resources if r.entry)
    return {"passed": True, "seconds": seconds, "registers": registers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=16, help="Points per template and dtype.")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as cache, ThreadPoolExecutor(max_workers=2) as pool:
        backend = CudaBackend(cache_dir=Path(cache), arch="sm_90")  # a fresh cache: cold compiles
        for template in spaces():
            for dtype in TARGET_DTYPES["cuda"]:
                if not template.accepts(dtype):
                    continue
                points = list(template.valid_points())
                sample = rng.sample(points, min(args.points, len(points)))
                results = list(pool.map(partial(one, backend, template, dtype), sample))
                passed = [r for r in results if r["passed"]]
                rows.append(
                    {
                        "template": template.name
                        if template.file
                        else f"fusion:{template.problem}",
                        "dtype": dtype,
                        "valid_points": len(points),
                        "sampled": len(sample),
                        "passed": len(passed),
                        "refused": dict(Counter(r["reason"] for r in results if not r["passed"])),
                        "median_compile_s": statistics.median(r["seconds"] for r in passed)
                        if passed
                        else None,
                        "median_registers": statistics.median(r["registers"] for r in passed)
                        if passed
                        else None,
                    }
                )
                print(_line(rows[-1]), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "cuda_prefilter.json"
    out.write_text(json.dumps({"seed": args.seed, "points": args.points, "rows": rows}, indent=2))
    sampled = sum(r["sampled"] for r in rows)
    refused = sum(r["sampled"] - r["passed"] for r in rows)
    print(f"\n{refused} of {sampled} sampled points refused before any GPU time; wrote {out}")


def _line(row: dict[str, Any]) -> str:
    compile_s = row["median_compile_s"]
    registers = row["median_registers"]
    return (
        f"{row['template']:28s} {row['dtype']:5s} {row['passed']:3d}/{row['sampled']:<3d} passed"
        f"  compile {compile_s if compile_s is None else round(compile_s, 2)!s:>5} s"
        f"  registers {registers!s:>5}  refused {row['refused'] or '-'}"
    )


if __name__ == "__main__":
    main()
