"""Write kernels/examples/<problem>.c from each problem's best known template point.

Usage: .venv/bin/python bench/write_examples.py
"""

from __future__ import annotations

from pathlib import Path

from gpu_workers.targets import target_of
from kernels.templates import EXAMPLE_TEMPLATES, example_file_text

EXAMPLES = Path(__file__).resolve().parent.parent / "kernels" / "examples"


def main() -> None:
    EXAMPLES.mkdir(exist_ok=True)
    for problem in EXAMPLE_TEMPLATES:
        path = EXAMPLES / f"{problem}.c"
        path.write_text(example_file_text(problem, target_of("cpu").built_flags))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
