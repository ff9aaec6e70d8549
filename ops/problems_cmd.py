"""`kfactory problems`: the problem library, its kernel signatures, shapes and templates."""

from __future__ import annotations

from typing import Any

import msgspec
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from actors.search.spaces import kernel_templates
from kernels.builtin import BUILTIN
from kernels.design_space import TARGET_DTYPES
from kernels.loading import ProblemLoadError, load_problem
from kernels.spec import Problem
from kernels.templates import EXAMPLES, example_kernel
from kernels.user_spaces import SpaceError
from ops.errors import UserError

problems_app = typer.Typer(
    name="problems",
    help=(
        "The problem library: each target operation with its C signature and shapes.\n\n"
        "Examples:\n\n"
        "  kfactory problems                 list every built-in problem\n\n"
        "  kfactory problems --json          the same as JSON\n\n"
        "  kfactory problems show softmax    details, design spaces and an example kernel\n\n"
        "  kfactory problems show my_ops.py:SWIGLU   a problem from your own file"
    ),
    invoke_without_command=True,
    no_args_is_help=False,
)


def _shape_text(shape: dict[str, int]) -> str:
    return "x".join(f"{shape[d]}" for d in shape)


def _summary(problem: Problem) -> dict[str, Any]:
    return {
        "name": problem.name,
        "signature": problem.c_signature(),
        "dims": list(problem.dims),
        "derived": dict(problem.derived),
        "constraints": list(problem.constraints),
        "test_shapes": [dict(s) for s in problem.test_shapes],
        "default_shape": dict(problem.default_shape),
        "graph": list(problem.graph),
        "description": problem.description,
    }


@problems_app.callback()
def list_problems(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the built-in problems with their kernel signatures and shapes."""
    if ctx.invoked_subcommand is not None:
        return
    problems = [BUILTIN[name] for name in sorted(BUILTIN)]
    if json_out:
        print(msgspec.json.encode([_summary(p) for p in problems]).decode())
        return
    table = Table(title="Kernel Factory problems (kfactory problems show NAME for details)")
    table.add_column("name", no_wrap=True)  # a name is typed back whole
    for column in ("C signature", "test shapes", "default shape"):
        table.add_column(column, overflow="fold")
    for p in problems:
        dims = ",".join(p.dims)
        table.add_row(
            p.name,
            p.c_signature(),
            "; ".join(_shape_text(s) for s in p.test_shapes) + f"  ({dims})",
            _shape_text(p.default_shape),
        )
    Console().print(table)


@problems_app.command("show")
def show(
    name: str = typer.Argument(..., help="A built-in name (softmax) or path.py:NAME."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
    target: str = typer.Option("cpu", help="Whose templates and example: cpu or cuda."),
    dtype: str = typer.Option("fp32", help="The example's element type (cuda: bf16, fp16)."),
) -> None:
    """Show one problem: reference, signature, shapes, tolerances, cost, templates, an example.

    Examples:

      kfactory problems show softmax

      kfactory problems show softmax --target cuda --dtype bf16

      kfactory problems show matmul --json

      kfactory problems show softmax > /dev/null; kfactory problems show kda
    """
    try:
        problem = load_problem(name)
    except ProblemLoadError as exc:
        raise UserError(str(exc)) from None
    cost = problem.cost_for(problem.default_shape)
    if target not in TARGET_DTYPES or dtype not in TARGET_DTYPES[target]:
        raise UserError(f"choose a target and dtype among {TARGET_DTYPES}")
    try:  # resolved as a campaign's planner resolves them: by the problem's load spec
        templates = kernel_templates(name, target)
    except SpaceError as exc:
        raise UserError(str(exc)) from None
    builtin = problem.load_spec in BUILTIN
    example = example_kernel(problem.load_spec, target, dtype) if builtin else None
    details = {
        **_summary(problem),
        "arguments": [
            {"name": a.name, "dims": list(a.dims), "output": a.output} for a in problem.args
        ],
        "distributions": list(problem.distributions),
        "tolerances": {k: {"rtol": t.rtol, "atol": t.atol} for k, t in problem.tolerances.items()},
        "cost_at_default_shape": {"bytes_moved": cost.bytes_moved, "flops": cost.flops},
        "templates": [
            {
                "name": t.name,
                "algorithm": t.algorithm,
                "parameters": {p.name: list(p.choices) for p in t.params},
                "constraints": [c.name for c in t.constraints],
                "best_known": t.best_known,
            }
            for t in templates
        ],
        "example_flags": list(example.flags) if example else None,
        "example_kernel": example.source if example else None,
    }
    if json_out:
        print(msgspec.json.encode(details).decode())
        return
    out = Console(highlight=False)
    out.print(f"[bold]{escape(problem.name)}[/bold]: {escape(problem.description)}")
    out.print(f"\nC signature:   {problem.c_signature()}", markup=False)
    out.print("Calling:       one pointer per array (64-byte aligned), then the dims as int64_t")
    width = max(6, *(len(a.name) for a in problem.args))
    for a in problem.args:
        role = "output" if a.output else "input"
        out.print(
            f"  {a.name:{width}s} {role:6s} [{', '.join(a.dims)}] float32, row-major", markup=False
        )
    for name, text in problem.derived.items():
        out.print(
            f"Derived dim:   {name} = {text} (not passed: the kernel computes it)", markup=False
        )
    for text in problem.constraints:
        out.print(f"Constraint:    {text} (every shape)", markup=False)
    out.print(f"Test shapes:   {', '.join(str(s) for s in problem.test_shapes)}", markup=False)
    out.print(f"Default shape: {problem.default_shape} (benchmarks)", markup=False)
    out.print(f"Inputs from:   {', '.join(problem.distributions)}")
    tol = ", ".join(f"{k}: rtol {t.rtol:g}, atol {t.atol:g}" for k, t in problem.tolerances.items())
    out.print(f"Tolerances:    {tol} (|got - expected| <= atol + rtol * scale)")
    out.print(f"Cost:          {cost.bytes_moved:,} bytes moved, {cost.flops:,} flops at default")
    if problem.graph:
        out.print(f"Graph:         {' -> '.join(problem.graph)}")
    for t in templates:
        out.print(f"\nTemplate [bold]{escape(t.name)}[/bold] ({t.target}): {escape(t.algorithm)}")
        for p in t.params:
            out.print(f"  {p.name:11s} {list(p.choices)}  {p.doc}", markup=False)
        for c in t.constraints:
            out.print(f"  constraint: {c.name}: {c.doc}", markup=False)
    if example is not None:
        out.print(f"\n{EXAMPLES[target].kind} (flags: {' '.join(example.flags)}):\n")
        print(example.source)


def register(app: typer.Typer) -> None:
    app.add_typer(problems_app, name="problems")
