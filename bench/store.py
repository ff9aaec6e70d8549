"""Event-store benchmark: prints a table and writes bench/results/store.json.

python bench/store.py [--events N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ops.bench_store import run_store_benchmark
from ops.output import print_rows

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args()
    results = run_store_benchmark(args.events)
    out = Path(__file__).parent / "results" / "store.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print_rows(
        ["figure", "value"],
        [(k, f"{v:,.2f}") for k, v in results.items() if isinstance(v, int | float)],
        "table",
    )
    print(f"wrote {out}")
