"""Row softmax 4096x4096 fp32 near this host's limit (issue 13's second figure).

Usage (Kernel Tuner's brute force first: `make bench-kt`, or bench/kernel_tuner_softmax.py,
which writes bench/results/kernel_tuner_brute_force.json):
  kfactory best CAMPAIGN --home HOME -o /tmp/factory_best.c
  .venv/bin/python bench/softmax_limit.py --factory /tmp/factory_best.c --rounds 20

`--point prefetch_pass=output --point prefetch_pass=exp` times softmax_rows points (its best
known point with those changes) beside the others.

One neutral interleaved run (bench/native_harness.py): Kernel Tuner's fastest configs (by
its own timing), the factory's best (a file from `kfactory best`, flags on its first line),
the hand-written AVX2 kernels of bench/softmax_hand.c (each structure x exp variant asked
for), numpy and the calibration's copy. Each contender's output is checked against the
float64 reference first. Then the ceilings of bench/roofline.py give the softmax bound
max(bytes / copy bandwidth, elements / softmax arithmetic rate), each part reached by a
measured kernel: the copy (its fastest call, of the ceilings' and the interleaved run's:
the host's memory has a fast and a slow mode), and softmax's own arithmetic on
cache-resident rows (a max pass, the exps with their sum, the scale). The looser bound
with the exps alone in place of that arithmetic is reported beside it (`of_exp_bound`).
The fastest copy call of a run is one call in a good minute: on a virtual machine whose
neighbours share its memory, the copy's bandwidth moves by up to half from one minute to
the next, so `of_bound_in_its_round` ("of round") also gives each kernel against the same
bound with the copy timed in its own round (the median over rounds of bound / kernel):
the memory's state of that moment for both.
Reports the median, IQR, the median of per-round ratios against the fastest Kernel Tuner
config, the fraction of the calibrated copy bandwidth and of the copy timed in this run,
and the load average; and the CPU time of each call (all threads of this process), whose
per-round ratios a loaded host skews far less than the wall time's. Writes
bench/results/softmax_limit.json, and adds its headline figures to this host kind's row of
bench/results/hosts.md (bench/host_results.py): the promoted best (campaign_rank_1, else
the first --factory kernel) against Kernel Tuner's fastest and the ceilings, the fastest
hand kernel against Kernel Tuner's, and the fastest of the top N against the promoted best.

With `--home HOME --campaign ID` the campaign's top `--top` (4) kernels by its leaderboard
join the run as campaign_rank_1 (its promoted best: the final run's winner once it had
one) to campaign_rank_N, and the run reports whether the promoted best is within noise of
the fastest of them in this neutral run: the median and IQR of its per-round time ratio
against that fastest one (within noise when the IQR reaches 1).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import host_results  # noqa: E402
from kernel_tuner_softmax import KT_SPACE, SHAPE, kernel_tuner_library  # noqa: E402
from native_harness import (  # noqa: E402
    Call,
    Workload,
    compile_library,
    copy_call,
    interleaved,
    kernel_file,
    load_average,
    native_call,
    summary,
    timed,
)
from roofline import measure  # noqa: E402

from actors.campaign.leaderboard import campaign_leaderboard  # noqa: E402
from actors.records.best_kernels import write_kernel  # noqa: E402
from gpu_workers.cache_root import cache_root  # noqa: E402
from gpu_workers.cpu.calibrate import load_or_calibrate  # noqa: E402
from kernels.builtin import BUILTIN  # noqa: E402
from kernels.templates import TEMPLATES  # noqa: E402
from ops.store_access import open_history, rebuild_campaign  # noqa: E402

RESULTS = ROOT / "bench" / "results"
HAND_SOURCE = ROOT / "bench" / "softmax_hand.c"
HAND_FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp")
STRUCTURES = {0: "3pass", 1: "buf_nt", 2: "buf", 3: "online"}
EXPS = {0: "cephes", 4: "exp2d4", 5: "exp2d5", 6: "exp2d4r"}


def hand_library(structure: int, exp: int) -> tuple[str, Path]:
    name = f"hand_{STRUCTURES[structure]}_{EXPS[exp]}"
    defines = f"#define STRUCTURE {structure}\n#define EXP {exp}\n"
    return name, compile_library(name, defines + HAND_SOURCE.read_text(), HAND_FLAGS)


def template_point_library(changes: str) -> tuple[str, Path]:
    """softmax_rows at its best known point with `changes` ("param=value,..."), and the
    values its structures fix (`Template.canonical`: fuse=pipelined is enough), built."""
    template = TEMPLATES["softmax_rows"]
    point = dict(template.best_known)
    for change in changes.split(","):
        key, _, text = change.partition("=")
        if key not in point:
            raise SystemExit(f"--point {changes}: softmax_rows has no parameter {key!r}")
        old = point[key]
        point[key] = text == "True" if isinstance(old, bool) else type(old)(text)
    rendered = template.render(template.canonical(point))
    name = "point_" + changes.replace("=", "_").replace(",", "_")
    return name, compile_library(name, rendered.source, rendered.flags)


def source_library(path: Path, name: str) -> Path:
    """A kernel file (`native_harness.kernel_file`), built with the flags it names."""
    return compile_library(name, *kernel_file(path))


def campaign_top(home: Path, campaign: str, top: int, workdir: Path) -> list[Path]:
    """The campaign's top kernels by its leaderboard, rank 1 first, as kernel files."""
    with open_history(home) as snapshot:
        rebuilt = rebuild_campaign(snapshot, campaign)
    board = campaign_leaderboard(rebuilt.history, campaign)
    workdir.mkdir(parents=True, exist_ok=True)
    files = []
    for row in board.rows[:top]:
        files.append(write_kernel(row.candidate, workdir / f"{campaign}_rank_{row.rank}.c"))
        print(f"campaign_rank_{row.rank}: {row.candidate_id} ({row.decided_by})", flush=True)
    return files


def promoted_versus_fastest(samples: dict[str, list[int]], names: list[str]) -> dict[str, Any]:
    """The promoted best (`names[0]`) against the fastest of `names` in this run, by the
    median of per-round time ratios; within noise when their IQR reaches 1."""
    fastest = min(names, key=lambda n: statistics.median(samples[n]))
    ratios = [b / f for b, f in zip(samples[names[0]], samples[fastest], strict=True)]
    q1, median, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return {
        "promoted": names[0],
        "fastest": fastest,
        "ratio_median": median,
        "ratio_q1": q1,
        "ratio_q3": q3,
        "within_noise": fastest == names[0] or q1 <= 1.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds")
    parser.add_argument("--factory", type=Path, action="append", default=[], help="kernel file")
    parser.add_argument("--kt-top", type=int, default=3, help="Kernel Tuner's fastest N configs")
    parser.add_argument(
        "--hand",
        default="0:6,1:6,0:4,1:4,0:0,3:5",
        help="hand-written variants STRUCTURE:EXP, comma separated (see softmax_hand.c)",
    )
    parser.add_argument("--home", type=Path, help="a run folder holding --campaign")
    parser.add_argument("--campaign", help="time this campaign's top kernels too")
    parser.add_argument("--top", type=int, default=4, help="the campaign's top N kernels")
    parser.add_argument(
        "--point",
        action="append",
        default=[],
        help="a softmax_rows point to time too: its best known point with these changes, "
        "and the values its structures fix, e.g. prefetch=1,prefetch_pass=exp or "
        "fuse=pipelined,streaming=True (repeat for more points)",
    )
    parser.add_argument(
        "--shared-memory",
        action="store_true",
        help="every array in shared memory, as the factory's arena holds a kernel's (4 KiB "
        "pages where the host's shared memory takes no transparent huge pages)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "softmax_limit.json")
    args = parser.parse_args()
    started = time.time()
    loads: dict[str, list[float]] = {"start": load_average()}
    calibration = load_or_calibrate(cache_root())
    bandwidth = calibration.memory_bandwidth_gbs * 1e9
    spec = BUILTIN["softmax"]
    workload = Workload(spec, SHAPE, shared=args.shared_memory)
    elements = SHAPE["rows"] * SHAPE["cols"]

    contenders: dict[str, Call] = {}
    kt_path = RESULTS / "kernel_tuner_brute_force.json"
    kt: dict[str, Any] = json.loads(kt_path.read_text()) if kt_path.exists() else {}
    kt_names: list[str] = []
    for i, config in enumerate(kt.get("ranked", [])[: args.kt_top]):
        name = f"kernel_tuner_{i + 1}"
        library = kernel_tuner_library({k: int(config[k]) for k in KT_SPACE}, name)
        contenders[name] = native_call(library, workload)
        kt_names.append(name)
    for i, path in enumerate(args.factory):
        name = f"factory_{i + 1}"
        contenders[name] = native_call(source_library(path, name), workload)
    campaign_names: list[str] = []
    if args.campaign:
        kernels = campaign_top(args.home, args.campaign, args.top, args.out.parent / "campaign")
        for rank, path in enumerate(kernels, 1):
            name = f"campaign_rank_{rank}"
            contenders[name] = native_call(source_library(path, name), workload)
            campaign_names.append(name)
    for changes in args.point:
        name, library = template_point_library(changes)
        contenders[name] = native_call(library, workload)
    for variant in filter(None, args.hand.split(",")):
        structure, exp = (int(v) for v in variant.split(":"))
        name, library = hand_library(structure, exp)
        contenders[name] = native_call(library, workload)
    contenders["numpy"] = timed(lambda i: spec.baseline(workload.inputs[i]), workload)

    errors: dict[str, float] = {}
    for name, call in contenders.items():
        call(0)
        errors[name] = workload.max_rel_error(0) if name != "numpy" else 0.0
        print(f"{name}: max relative error {errors[name]:.1e}", flush=True)
    contenders["copy_x_to_y"] = copy_call(workload, "x", "y")
    errors["copy_x_to_y"] = float("nan")

    ceilings_before = measure(copy_bytes=workload.nbytes, rounds=5)
    loads["after_roofline"] = load_average()
    cpu: dict[str, list[int]] = {}
    samples = interleaved(contenders, args.rounds, workload.sets, cpu=cpu)
    loads["after_interleaved"] = load_average()
    ceilings_after = measure(copy_bytes=workload.nbytes, rounds=5)
    loads["end"] = load_average()
    ceilings = max((ceilings_before, ceilings_after), key=lambda c: c.softmax_per_s_all_best)
    # the host's memory has a fast and a slow mode: the copy's fastest call in the run
    # beside the kernels counts too, so that the bound is the mode the fastest saw
    fastest_copy_ms = min(
        min(samples["copy_x_to_y"]) / 1e6,
        *(
            workload.nbytes / (c.copy_gbs_best * 1e9) * 1e3
            for c in (ceilings_before, ceilings_after)
        ),
    )
    arithmetic_ms = elements / ceilings.softmax_per_s_all_best * 1e3
    bound_ms = max(fastest_copy_ms, arithmetic_ms)
    exp_bound_ms = max(fastest_copy_ms, elements / ceilings.exp_per_s_all_best * 1e3)
    # the same bound with the copy of each round: the memory's mode of that round
    round_bounds_ns = [max(ns, arithmetic_ms * 1e6) for ns in samples["copy_x_to_y"]]

    reference = min(kt_names, key=lambda n: statistics.median(samples[n])) if kt_names else "numpy"
    table = summary(samples, reference)
    cpu_table = summary(cpu, reference)
    copy_ms = table["copy_x_to_y"]["median_ms"]
    for name, row in table.items():
        row["calibrated_bandwidth_fraction"] = (
            workload.nbytes / (row["median_ms"] / 1e3) / bandwidth
        )
        row["fraction_of_copy_in_this_run"] = copy_ms / row["median_ms"]
        row["of_roofline_bound"] = bound_ms / row["median_ms"]
        row["of_exp_bound"] = exp_bound_ms / row["median_ms"]
        row["of_bound_in_its_round"] = statistics.median(
            b / k for b, k in zip(round_bounds_ns, samples[name], strict=True)
        )
        row["max_rel_error"] = errors[name]
        row["cpu_median_ms"] = cpu_table[name]["median_ms"]
        row["cpu_speedup_vs_reference"] = cpu_table[name]["speedup_vs_reference"]
    print(
        f"\nhost {calibration.cpu_model}; calibrated copy {calibration.memory_bandwidth_gbs:.1f}"
        f" GB/s; ratios against {reference}"
    )
    print(
        f"roofline now: copy {ceilings.copy_gbs_best:.1f} GB/s (median "
        f"{ceilings.copy_gbs_median:.1f}), softmax arithmetic "
        f"{ceilings.softmax_per_s_all_best / 1e9:.2f} G elements/s on {ceilings.threads} cores "
        f"(median {ceilings.softmax_per_s_all_median / 1e9:.2f}; {ceilings.softmax_variant}): "
        f"bound {bound_ms:.2f} ms; the exps alone {ceilings.exp_per_s_all_best / 1e9:.2f} G/s "
        f"(median {ceilings.exp_per_s_all_median / 1e9:.2f}): {exp_bound_ms:.2f} ms; the "
        f"fastest copy of the run {fastest_copy_ms:.2f} ms"
    )
    print(
        f"{'kernel':22s} {'median ms':>10s} {'IQR ms':>14s} {'vs ref':>7s} {'of calib':>9s} "
        f"{'of copy':>8s} {'of bound':>9s} {'of round':>9s} {'max rel err':>12s} {'cpu ms':>8s} "
        f"{'cpu vs ref':>10s}"
    )
    for name, row in sorted(table.items(), key=lambda kv: kv[1]["median_ms"]):
        print(
            f"{name:22s} {row['median_ms']:10.2f} {row['q1_ms']:6.2f}-{row['q3_ms']:<7.2f} "
            f"{row['speedup_vs_reference']:6.2f}x {row['calibrated_bandwidth_fraction']:8.1%} "
            f"{row['fraction_of_copy_in_this_run']:7.1%} {row['of_roofline_bound']:8.1%} "
            f"{row['of_bound_in_its_round']:8.1%} {row['max_rel_error']:12.1e} "
            f"{row['cpu_median_ms']:8.2f} {row['cpu_speedup_vs_reference']:9.2f}x"
        )
    versus = promoted_versus_fastest(samples, campaign_names) if campaign_names else None
    if versus is not None:
        print(
            f"promoted best {versus['promoted']} against the fastest of the campaign's top "
            f"{len(campaign_names)}, {versus['fastest']}: per-round ratio "
            f"{versus['ratio_median']:.3f} (IQR {versus['ratio_q1']:.3f}-"
            f"{versus['ratio_q3']:.3f}), within noise: {versus['within_noise']}"
        )
    print(f"load average: {loads}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "shape": SHAPE,
                "bytes_moved": workload.nbytes,
                "calibrated_bandwidth_gbs": calibration.memory_bandwidth_gbs,
                "cpu_model": calibration.cpu_model,
                "kernel_tuner_contenders": dict(
                    zip(kt_names, kt.get("ranked", [])[: args.kt_top], strict=False)
                ),
                "factory_sources": [str(p) for p in args.factory],
                "ratios_against": reference,
                "roofline": {
                    "before": ceilings_before.to_json(),
                    "after": ceilings_after.to_json(),
                    "bound_ms": bound_ms,
                    "fastest_copy_ms": fastest_copy_ms,
                    "exp_bound_ms": exp_bound_ms,
                },
                "interleaved": table,
                "campaign": args.campaign,
                "promoted_versus_fastest_of_top": versus,
                "load_average": loads,
                "seconds": time.time() - started,
            },
            indent=2,
        )
    )
    print(f"wrote {args.out}")
    promoted = "campaign_rank_1" if campaign_names else "factory_1" if args.factory else None
    figures = host_figures(table, kt_names, promoted, versus)
    if figures and not args.shared_memory:  # the table holds the default setting's figures
        print(f"host table: {host_results.record(figures, ' '.join(sys.argv))}")


def host_figures(
    table: dict[str, dict[str, float]],
    kt_names: list[str],
    promoted: str | None,
    versus: dict[str, Any] | None,
) -> dict[str, float]:
    """This run's headline figures for the per-host table: the promoted best against
    Kernel Tuner's fastest and the ceilings, the fastest hand kernel against Kernel
    Tuner's (none of these without Kernel Tuner's configs in the run), and the fastest of
    the campaign's top N against the promoted best."""
    figures: dict[str, float] = {}
    if versus is not None:
        figures["fastest_of_top_n_vs_promoted"] = versus["ratio_median"]
    if not kt_names:
        return figures
    hand = [row["speedup_vs_reference"] for name, row in table.items() if name.startswith("hand")]
    if hand:
        figures["hand_best_vs_kernel_tuner"] = max(hand)
    if promoted is not None:
        best = table[promoted]
        figures |= {
            "promoted_best_vs_kernel_tuner": best["speedup_vs_reference"],
            "of_softmax_bound": best["of_roofline_bound"],
            "of_exp_bound": best["of_exp_bound"],
            "of_copy_in_this_run": best["fraction_of_copy_in_this_run"],
            "of_bound_in_its_round": best["of_bound_in_its_round"],
        }
    return figures


if __name__ == "__main__":
    main()
