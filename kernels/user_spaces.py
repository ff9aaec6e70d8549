"""Design spaces from the user's own files, searched exactly like the built-in templates.

Three kinds, each a `Template` (so the planner, the search and the kernel writer treat
them as they treat the built-ins):

- `JinjaTemplate`: a jinja2 file next to the user's problem or campaign file, rendered
  with the point's parameters. The package's `_common.c.j2` and `_math.c.j2` helpers stay
  includable.
- `MacroTemplate`: plain C whose parameters are macros, as Kernel Tuner users write them.
  The point's values become `-DNAME=VALUE` flags; the source is used as it is.
- `GenericSpace`: any kernel the user already has (a seed), tuned without an edit:
  compiler flags from an allowed set, a vector-width hint (`-mprefer-vector-width`), and
  for a kernel that uses `#pragma omp`, the thread count and the schedule of its
  worksharing loops (`num_threads` and `schedule` clauses, added only where the pragma
  names none).

A problem file declares its spaces in a module-level `SPACES` list of `KernelSpace`; a
campaign file in `[[spaces]]` tables with the same fields. Restrictions are Python
expressions over the parameter names (`"BLOCK * UNROLL <= 64"`), or, in a problem file,
functions of the point.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any

import jinja2

from kernels.design_space import (
    Constraint,
    Param,
    Params,
    ParamValue,
    Rendered,
    Template,
    implied,
)

DEFAULT_FLAGS = "-O3 -march=native"
"""The flags of a user template point that chooses none (a `flags` parameter chooses)."""
GENERIC_FLAGS: tuple[str, ...] = (
    "-O3",
    "-O2 -march=native",
    "-O3 -march=native",
    "-O3 -march=native -ffast-math",
    "-O3 -march=native -funroll-loops",
)
"""The flags a generic space chooses from; the first is the seed as it is."""
AS_WRITTEN = "as_written"
_MACRO_VALUE = re.compile(r"^[A-Za-z0-9_.+-]+$")
_MACRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OMP = re.compile(r"^\s*#\s*pragma\s+omp\b", re.MULTILINE)
_OMP_PARALLEL = re.compile(r"^(\s*#\s*pragma\s+omp\s+parallel\b.*)$", re.MULTILINE)
_OMP_LOOP = re.compile(
    r"^(\s*#\s*pragma\s+omp\s+(?:parallel\s+)?for\b.*)$",
    re.MULTILINE,
)
_SAFE_BUILTINS = {"min": min, "max": max, "abs": abs, "int": int, "len": len, "bool": bool}

Restriction = str | Callable[[dict[str, ParamValue]], bool]


class SpaceError(ValueError):
    """A declared space that cannot be used; the message is one line naming the file."""


@dataclass(frozen=True)
class KernelSpace:
    """A space declared in a problem file's `SPACES` list.

    `file`: a jinja2 template (`*.j2`) or plain C with macro parameters, relative to the
    problem file. `params`: each parameter's values (Kernel Tuner's `tune_params`).
    `restrictions`: expressions over the parameter names, or functions of the point.
    `problem`: the attribute name of the problem it serves; empty for every problem of
    the file. `best`: a starting point (LLM mode seeds from it); default the first valid
    one. `name`: default the file's stem; `@` and a digest of the file's text are added,
    so that the points of an edited file are new to the search."""

    file: str
    params: Mapping[str, Sequence[ParamValue]]
    restrictions: Sequence[Restriction] = ()
    problem: str = ""
    best: Mapping[str, ParamValue] = field(default_factory=dict)
    name: str = ""
    algorithm: str = ""


def uses_openmp(source: str) -> bool:
    return _OMP.search(source) is not None


def openmp_flag(source: str, threads: int | None = None) -> str | None:
    """-fopenmp for a kernel with omp pragmas that may run threads, -fopenmp-simd for one on
    one thread (its `omp simd` still counts), nothing for a kernel without pragmas."""
    if not uses_openmp(source):
        return None
    return "-fopenmp-simd" if threads == 1 else "-fopenmp"


def _constraint(restriction: Restriction, names: set[str], where: str) -> Constraint:
    if callable(restriction):
        label = getattr(restriction, "__name__", "restriction")
        return Constraint(label, label, lambda p: bool(restriction(dict(p))))
    text = str(restriction)
    try:
        code = compile(text, f"{where} restriction", "eval")
    except SyntaxError as exc:
        raise SpaceError(f"{where}: restriction {text!r} is not an expression: {exc.msg}") from None
    if any(isinstance(const, CodeType) for const in code.co_consts):
        # A comprehension or lambda hides its names in a code object of its own; a
        # restriction may come from a campaign on the bus, so it is arithmetic only.
        raise SpaceError(f"{where}: restriction {text!r} may not use comprehensions or lambdas")
    unknown = sorted(set(code.co_names) - names - set(_SAFE_BUILTINS))
    if unknown:
        raise SpaceError(f"{where}: restriction {text!r} names unknown parameters {unknown}")

    def holds(p: Params) -> bool:
        return bool(eval(code, {"__builtins__": _SAFE_BUILTINS}, dict(p)))

    return Constraint(text, text, holds)


def _params(values: Mapping[str, Sequence[ParamValue]], where: str) -> tuple[Param, ...]:
    if not values:
        raise SpaceError(f"{where}: the space has no parameters")
    params: list[Param] = []
    for name, choices in values.items():
        if isinstance(choices, str | bytes) or not isinstance(choices, Sequence) or not choices:
            raise SpaceError(f"{where}: parameter {name!r} needs a non-empty list of values")
        params.append(Param(str(name), tuple(choices), ""))
    return tuple(params)


def _first_valid(
    params: tuple[Param, ...], constraints: tuple[Constraint, ...]
) -> dict[str, ParamValue] | None:
    names = [p.name for p in params]
    for values in itertools.product(*(p.choices for p in params)):
        point = dict(zip(names, values, strict=True))
        if all(c.holds(point) for c in constraints):
            return point
    return None


def _flags(params: Params, source: str) -> tuple[str, ...]:
    flags = str(params.get("flags", DEFAULT_FLAGS)).split()
    threads = params.get("threads")
    omp = openmp_flag(source, int(threads) if threads is not None else None)
    return (*flags, omp) if omp else tuple(flags)


@functools.cache
def _environment(folder: str) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.ChoiceLoader(
            [
                jinja2.FileSystemLoader(folder),
                jinja2.PackageLoader("kernels", "cpu_templates"),
            ]
        ),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


@dataclass(frozen=True)
class JinjaTemplate(Template):
    folder: str = ""
    """The folder the template file is in; its includes are looked up there first."""

    def generate(self, params: Params, dtype: str) -> Rendered:
        try:
            source = (
                _environment(self.folder)
                .get_template(self.file)
                .render(template=self.name, dtype=dtype, **params)
            )
        except jinja2.TemplateError as exc:
            where = Path(self.folder) / self.file
            raise SpaceError(f"{where}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
        return Rendered(source=source, flags=_flags(params, source))


@dataclass(frozen=True)
class MacroTemplate(Template):
    source: str = ""

    def generate(self, params: Params, dtype: str) -> Rendered:
        defines = [
            f"-D{name}={int(value) if isinstance(value, bool) else value}"
            for name, value in params.items()
            if name != "flags"
        ]
        return Rendered(source=self.source, flags=(*_flags(params, self.source), *defines))


def with_openmp_clauses(source: str, threads: int, schedule: str) -> str:
    """The source with `num_threads(threads)` on each `omp parallel` that names none
    (threads > 1), and `schedule(schedule)` on each worksharing loop that names none."""
    if threads > 1:
        source = _OMP_PARALLEL.sub(
            lambda m: (
                m.group(1)
                if "num_threads" in m.group(1)
                else f"{m.group(1)} num_threads({threads})"
            ),
            source,
        )
    if schedule != AS_WRITTEN:
        source = _OMP_LOOP.sub(
            lambda m: (
                m.group(1) if "schedule" in m.group(1) else f"{m.group(1)} schedule({schedule})"
            ),
            source,
        )
    return source


def _hint_needs_native(p: Params) -> bool:
    return int(p["vector_width"]) == 0 or "-march=native" in str(p["flags"])


def _one_thread(p: Params) -> bool:
    return int(p["threads"]) == 1


@dataclass(frozen=True)
class GenericSpace(Template):
    source: str = ""

    def generate(self, params: Params, dtype: str) -> Rendered:
        source = self.source
        threads = int(params.get("threads", 0))
        if "threads" in params:
            source = with_openmp_clauses(source, threads, str(params["schedule"]))
        flags = list(str(params["flags"]).split())
        if int(params["vector_width"]):
            flags.append(f"-mprefer-vector-width={params['vector_width']}")
        omp = openmp_flag(source, threads)
        return Rendered(source=source, flags=(*flags, omp) if omp else tuple(flags))


def generic_space(name: str, problem: str, source: str, origin: str) -> GenericSpace:
    """The space around one kernel as it is: its first point (`defaults`) is the kernel
    compiled with -O3 and its own pragmas, untouched."""
    params = [
        Param("flags", GENERIC_FLAGS, "compiler flags"),
        Param("vector_width", (0, 256, 512), "-mprefer-vector-width (0: the compiler's)"),
    ]
    constraints = [
        Constraint("vector hint needs -march=native", "without it", _hint_needs_native),
    ]
    as_is: dict[str, ParamValue] = {"flags": GENERIC_FLAGS[0], "vector_width": 0}
    if uses_openmp(source):
        params += [
            Param("threads", (0, 1, 2), "OpenMP threads: 0 as written (all cores), 1: none"),
            Param("schedule", (AS_WRITTEN, "static", "dynamic", "guided"), "loop schedule"),
        ]
        constraints.append(
            implied(
                "schedule only matters with threads",
                "one thread runs the loop as written",
                _one_thread,
                {"schedule": AS_WRITTEN},
            )
        )
        as_is |= {"threads": 0, "schedule": AS_WRITTEN}
    return GenericSpace(
        name=name,
        problem=problem,
        target="cpu",
        file=origin,
        algorithm=f"the kernel in {Path(origin).name}, as written",
        params=tuple(params),
        constraints=tuple(constraints),
        defaults=as_is,
        best_known=as_is,
        source=source,
    )


def versioned(name: str, text: str) -> str:
    """`name@digest` of the file's text: the points of an edited file are new points (the
    librarian dedupes by template name and parameters, across campaigns)."""
    return f"{name}@{hashlib.sha256(text.encode()).hexdigest()[:6]}"


def seed_spaces(problem: str, sources: Sequence[str]) -> list[GenericSpace]:
    """A generic space around each seed kernel file, named `seed_<stem>@<digest>`."""
    spaces: list[GenericSpace] = []
    taken: set[str] = set()
    for path_text in sources:
        path = Path(path_text)
        try:
            source = path.read_text()
        except OSError as exc:
            raise SpaceError(f"seed kernel {path}: cannot read it: {exc.strerror}") from None
        stem = f"seed_{re.sub(r'[^A-Za-z0-9_]', '_', path.stem)}"
        names = (stem, *(f"{stem}_{i}" for i in range(2, 99)))
        name = next(versioned(n, source) for n in names if versioned(n, source) not in taken)
        taken.add(name)
        spaces.append(generic_space(name, problem, source, str(path)))
    return spaces


def build_space(declared: KernelSpace, base: Path, problem: str, target: str = "cpu") -> Template:
    """The template a declaration describes; `file` is relative to `base` (a folder)."""
    path = (base / declared.file).resolve()
    where = str(path)
    if not path.is_file():
        raise SpaceError(f"{where}: the space's file does not exist")
    params = _params(declared.params, where)
    names = {p.name for p in params}
    for name in names - {"flags"}:
        if path.suffix != ".j2" and not _MACRO_NAME.match(name):
            raise SpaceError(f"{where}: parameter {name!r} is not a C macro name")
    if path.suffix != ".j2":
        for p in params:
            bad = [v for v in p.choices if p.name != "flags" and not _MACRO_VALUE.match(str(v))]
            if bad:
                raise SpaceError(f"{where}: values {bad} of {p.name} cannot be -D macro values")
    constraints = tuple(_constraint(r, names, where) for r in declared.restrictions)
    first = _first_valid(params, constraints)
    if first is None:
        raise SpaceError(f"{where}: no point satisfies every restriction")
    best = dict(declared.best) or first
    name = versioned(
        declared.name or re.sub(r"[^A-Za-z0-9_]", "_", path.name.split(".")[0]), path.read_text()
    )
    common: dict[str, Any] = {
        "name": name,
        "problem": problem,
        "target": target,
        "params": params,
        "constraints": constraints,
        "defaults": first,
        "best_known": best,
    }
    if path.suffix == ".j2":
        return JinjaTemplate(
            file=path.name,
            algorithm=declared.algorithm or f"jinja2 template {path.name}",
            folder=str(path.parent),
            **common,
        )
    return MacroTemplate(
        file=str(path),
        algorithm=declared.algorithm or f"macro kernel {path.name}",
        source=path.read_text(),
        **common,
    )


def declared_in_problem_file(problem_spec: str) -> list[KernelSpace]:
    """The `SPACES` a problem file declares for this problem (`/abs/file.py:NAME`); none
    for a built-in problem. The module is the one `kernels.loading` imported, if any."""
    path_text, sep, attr = problem_spec.rpartition(":")
    if not sep or not path_text.endswith(".py"):
        return []
    path = Path(path_text).resolve()
    module = _module(path)
    declared = getattr(module, "SPACES", [])
    if not isinstance(declared, list | tuple) or not all(
        isinstance(d, KernelSpace) for d in declared
    ):
        raise SpaceError(f"{path}: SPACES must be a list of kernels.KernelSpace")
    return [d for d in declared if d.problem in ("", attr)]


def _module(path: Path) -> Any:
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name.startswith("kfactory_user_") and file and Path(file).resolve() == path:
            return module
    name = f"kfactory_user_spaces_{abs(hash(path))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise SpaceError(f"{path} cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise SpaceError(f"importing {path} failed: {type(exc).__name__}: {exc}") from None
    return module
