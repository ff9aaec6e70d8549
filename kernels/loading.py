"""Find a problem by name: the built-in library, or `path/to/file.py:NAME` from a user."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

from kernels.builtin import BUILTIN
from kernels.spec import DTYPES, Problem


class ProblemLoadError(Exception):
    """The problem could not be found or is malformed; the message is one line."""


def load_problem(spec: str) -> Problem:
    """`softmax` (built-in) or `my_ops.py:SWIGLU` (a `Problem` object in a user file)."""
    if ":" not in spec and not spec.endswith(".py"):
        try:
            return BUILTIN[spec]
        except KeyError:
            known = ", ".join(sorted(BUILTIN))
            raise ProblemLoadError(
                f"unknown problem {spec!r}; built-in problems: {known}; "
                "or give a file as path.py:NAME"
            ) from None
    path_text, _, attr = spec.rpartition(":")
    if not path_text or not attr:
        raise ProblemLoadError(f"{spec!r}: write a problem file as path.py:NAME")
    return _load_from_file(Path(path_text), attr)


def _load_from_file(path: Path, attr: str) -> Problem:
    if not path.is_file():
        raise ProblemLoadError(f"problem file {path} does not exist")
    module_name = f"kfactory_user_problem_{abs(hash(path.resolve()))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ProblemLoadError(f"{path} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ProblemLoadError(
            f"importing {path} failed: {type(exc).__name__}: {exc}".splitlines()[0]
        ) from exc
    if not hasattr(module, attr):
        names = sorted(n for n, v in vars(module).items() if isinstance(v, Problem))
        hint = f"; Problem objects there: {', '.join(names)}" if names else ""
        raise ProblemLoadError(f"{path} has no attribute {attr!r}{hint}")
    problem = getattr(module, attr)
    if not isinstance(problem, Problem):
        raise ProblemLoadError(
            f"{path}:{attr} is a {type(problem).__name__}, not a kernels.Problem"
        )
    _validate(problem, f"{path}:{attr}")
    return dataclasses.replace(problem, spec=f"{path.resolve()}:{attr}")


def _validate(problem: Problem, where: str) -> None:
    dims = set(problem.dims)
    for arg in problem.args:
        unknown = [d for d in arg.dims if d not in dims]
        if unknown:
            raise ProblemLoadError(f"{where}: argument {arg.name!r} uses unknown dims {unknown}")
    if not problem.outputs:
        raise ProblemLoadError(f"{where}: the problem has no output argument")
    if len(problem.test_shapes) < 1:
        raise ProblemLoadError(f"{where}: give at least one test shape")
    for shape in (*problem.test_shapes, problem.default_shape):
        missing = dims - set(shape)
        if missing:
            raise ProblemLoadError(f"{where}: shape {shape} lacks dims {sorted(missing)}")
    unknown_dtypes = sorted(set(problem.tolerances) - set(DTYPES))
    if unknown_dtypes:
        raise ProblemLoadError(
            f"{where}: tolerances for unknown dtypes {unknown_dtypes}; known: {list(DTYPES)}"
        )
