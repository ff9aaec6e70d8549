"""Find a problem by name: the built-in library, or `path/to/file.py:NAME` from a user.

A problem file is imported with its folder on `sys.path` (it may import the modules
beside it, at its top), and checked before anything is run against it: its dims, rules
and shapes (a drawn shape must be movable to meet the constraints); then the reference,
the baseline and the error scale run on the smallest test shape (numpy warnings
silenced) and must return every output of the signature, by name, in its shape, as
floats (the reference as float64), and the cost model a `Cost`. Any mistake is refused
in one line naming `path.py:NAME` (ProblemLoadError), never blamed on a kernel. The
loaded problem's `spec` is the file's resolved path, so another process loads it again.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from kernels import shape_rules
from kernels.builtin import BUILTIN
from kernels.spec import DTYPES, Arrays, Cost, Problem, ProblemError


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
    module = _import(path)
    if not hasattr(module, attr):
        names = sorted(n for n, v in vars(module).items() if isinstance(v, Problem))
        hint = f"; Problem objects there: {', '.join(names)}" if names else ""
        raise ProblemLoadError(f"{path} has no attribute {attr!r}{hint}")
    problem = getattr(module, attr)
    if not isinstance(problem, Problem):
        raise ProblemLoadError(
            f"{path}:{attr} is a {type(problem).__name__}, not a kernels.Problem"
        )
    where = f"{path}:{attr}"
    _validate(problem, where)
    _check_shapes(problem, where)
    _check_functions(problem, where)
    return dataclasses.replace(problem, spec=f"{path.resolve()}:{attr}")


def _import(path: Path) -> ModuleType:
    """Import a problem file with its folder on sys.path, so that it can import the
    modules next to it (at its top: the folder is taken off the path again after)."""
    module_name = f"kfactory_user_problem_{abs(hash(path.resolve()))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ProblemLoadError(f"{path} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(module_spec)
    folder = str(path.resolve().parent)
    before = set(sys.modules)
    sys.modules[module_name] = module
    sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ProblemLoadError(
            _one_line(f"importing {path} failed: {type(exc).__name__}: {exc}")
        ) from exc
    finally:
        sys.path.remove(folder)
        # Siblings are forgotten, so that another folder's module of the same name is
        # imported afresh; the problem keeps the ones it imported.
        for name in set(sys.modules) - before:
            where = getattr(sys.modules[name], "__file__", None) or ""
            if name != module_name and where.startswith(folder + os.sep):
                del sys.modules[name]
    return module


def _one_line(text: str) -> str:
    return text.splitlines()[0] if text else text


def _validate(problem: Problem, where: str) -> None:
    try:
        shape_rules.check_rules(problem.dims, problem.derived, problem.constraints)
    except shape_rules.ShapeRuleError as exc:
        raise ProblemLoadError(f"{where}: {exc}") from None
    dims = {*problem.dims, *problem.derived}
    for arg in problem.args:
        unknown = [d for d in arg.dims if d not in dims]
        if unknown:
            raise ProblemLoadError(f"{where}: argument {arg.name!r} uses unknown dims {unknown}")
    if not problem.outputs:
        raise ProblemLoadError(f"{where}: the problem has no output argument")
    if len(problem.test_shapes) < 1:
        raise ProblemLoadError(f"{where}: give at least one test shape")
    if not problem.distributions:
        raise ProblemLoadError(f"{where}: the problem supports no input distribution")
    unknown_dtypes = sorted(set(problem.tolerances) - set(DTYPES))
    if unknown_dtypes:
        raise ProblemLoadError(
            f"{where}: tolerances for unknown dtypes {unknown_dtypes}; known: {list(DTYPES)}"
        )


def _check_shapes(problem: Problem, where: str) -> None:
    """Every given shape names exactly the dims and meets the constraints; the drawn ones
    can be moved to meet them."""
    for label, shape in [("test shape", s) for s in problem.test_shapes] + [
        ("default shape", problem.default_shape)
    ]:
        derived = sorted(set(shape) & set(problem.derived))
        if derived:
            raise ProblemLoadError(
                f"{where}: {label} {shape} gives the derived dims {derived}; leave them out"
            )
        faults = problem.shape_faults(shape)
        extra = sorted(set(shape) - set(problem.dims))
        if extra:
            faults.append(f"{shape} gives unknown dims {extra}")
        if faults:
            raise ProblemLoadError(f"{where}: {label} {faults[0]}")
    for seed in range(2):
        try:
            problem.trial_shapes(np.random.default_rng(seed))
        except ProblemError as exc:
            raise ProblemLoadError(
                f"{where}: {str(exc).split(': ', 1)[-1]}; give draw_shapes"
            ) from None
        except Exception as exc:
            raise ProblemLoadError(
                _one_line(f"{where}: draw_shapes raised {type(exc).__name__}: {exc}")
            ) from None


def _check_functions(problem: Problem, where: str) -> None:
    """The reference, the baseline and the error scale run on the smallest test shape,
    and give every output, by name, in the signature's shape, as floats; the cost model
    gives a Cost. Mistakes there are the problem's, and are refused here."""
    shape = min(problem.test_shapes, key=problem.nbytes)
    full = problem.full_shape(shape)
    at = f"(at {shape})"
    try:
        inputs = problem.generate(shape, problem.distributions[0], seed=0)
    except Exception as exc:
        raise ProblemLoadError(
            _one_line(f"{where}: making inputs raised {type(exc).__name__}: {exc} {at}")
        ) from None
    as64 = {k: v.astype(np.float64) for k, v in inputs.items()}
    expected = _outputs(problem, where, "reference", problem.reference, (as64,), full, at)
    for name, value in expected.items():
        if value.dtype != np.float64:
            raise ProblemLoadError(
                f"{where}: the reference returns {name} as {value.dtype}; it works in float64 {at}"
            )
    _outputs(problem, where, "baseline", problem.baseline, (inputs,), full, at)
    if problem.error_scale is not None:
        _outputs(problem, where, "error_scale", problem.error_scale, (as64, expected), full, at)
    try:
        cost = problem.cost(full)
    except Exception as exc:
        raise ProblemLoadError(
            _one_line(f"{where}: the cost model raised {type(exc).__name__}: {exc} {at}")
        ) from None
    if not isinstance(cost, Cost):
        raise ProblemLoadError(
            f"{where}: the cost model returns a {type(cost).__name__}, not a kernels.Cost"
        )


def _outputs(
    problem: Problem,
    where: str,
    what: str,
    function: Callable[..., Any],
    args: tuple[Any, ...],
    full: dict[str, int],
    at: str,
) -> Arrays:
    try:
        with np.errstate(all="ignore"):
            returned = function(*args)
    except Exception as exc:
        raise ProblemLoadError(
            _one_line(f"{where}: the {what} raised {type(exc).__name__}: {exc} {at}")
        ) from None
    names = [a.name for a in problem.outputs]
    if not isinstance(returned, Mapping):
        raise ProblemLoadError(
            f"{where}: the {what} returns a {type(returned).__name__}, "
            f"not a dict of the outputs {names} by name"
        )
    if sorted(map(str, returned)) != sorted(names):
        raise ProblemLoadError(
            f"{where}: the {what} returns {sorted(map(str, returned))}; "
            f"the signature's outputs are {names}"
        )
    arrays: Arrays = {}
    for arg in problem.outputs:
        value = np.asarray(returned[arg.name])
        want = arg.shape(full)
        if value.shape != want:
            raise ProblemLoadError(
                f"{where}: the {what} returns {arg.name} of shape {value.shape}; the "
                f"signature says {arg.name}[{', '.join(arg.dims)}] = {want} {at}"
            )
        if value.dtype.kind != "f" and value.dtype.name != "bfloat16":  # ml_dtypes' bf16
            raise ProblemLoadError(
                f"{where}: the {what} returns {arg.name} as {value.dtype}, not floats {at}"
            )
        arrays[arg.name] = value
    return arrays
