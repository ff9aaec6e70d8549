"""A structure that ignores some parameters fixes them (`kernels.design_space.implied`): a
point takes those values (`Template.canonical`) before the search judges it, so the
search proposes that structure as often as any other instead of pruning most of its
draws for values it never reads."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from actors.search.template_search import TemplateSearch
from kernels.design_space import ParamValue, Template
from kernels.templates import TEMPLATES
from kernels.user_spaces import generic_space

SOFTMAX = TEMPLATES["softmax_rows"]
OMP_KERNEL = """#include <stdint.h>
void kernel(const float *x, float *y, int64_t n) {
#pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) y[i] = x[i];
}
"""
SPACES: list[Template] = [
    *TEMPLATES.values(),
    generic_space("seed_copy@000000", "copy", OMP_KERNEL, "copy.c"),
]


def _draw(space: Template, rng: random.Random) -> dict[str, ParamValue]:
    return {p.name: rng.choice(p.choices) for p in space.params}


def _implied(space: Template) -> set[str]:
    return {c.name for c in space.constraints if c.implies is not None}


def test_each_structure_sets_the_parameters_it_ignores() -> None:
    point = {**SOFTMAX.best_known, "streaming": True, "prefetch": 1}
    pipelined = SOFTMAX.canonical(
        {**point, "fuse": "pipelined", "buffer": False, "tile": 512, "schedule": "dynamic"}
    )
    assert SOFTMAX.is_valid(pipelined)
    assert pipelined == {
        **point,
        "fuse": "pipelined",
        "buffer": True,
        "tile": 0,
        "schedule": "static",
        "prefetch_pass": "output",
    }
    online = SOFTMAX.canonical({**point, "fuse": "online", "buffer": True, "tile": 2048})
    assert (online["buffer"], online["tile"]) == (False, 0) and SOFTMAX.is_valid(online)
    unprefetched = SOFTMAX.canonical({**point, "prefetch": 0, "prefetch_pass": "exp"})
    assert unprefetched["prefetch_pass"] == "output"
    one_thread = SOFTMAX.canonical({**point, "threads": 1, "schedule": "dynamic"})
    assert one_thread["schedule"] == "static"
    assert SOFTMAX.canonical({**point, "isa": "avx512", "simdlen": 8})["simdlen"] == 16
    seed = SPACES[-1]
    as_written = seed.defaults["schedule"]
    assert seed.canonical({**seed.defaults, "threads": 1, "schedule": "guided"}) == {
        **seed.defaults,
        "threads": 1,
        "schedule": as_written,
    }


@pytest.mark.parametrize("space", SPACES, ids=lambda s: s.name)
def test_a_valid_point_is_its_own_canonical_form_and_a_drawn_one_breaks_no_implication(
    space: Template,
) -> None:
    rng = random.Random(7)
    implied = _implied(space)
    for _ in range(400):
        drawn = _draw(space, rng)
        canonical = space.canonical(drawn)
        assert not implied & set(space.violations(canonical)), (drawn, canonical)
        assert space.canonical(canonical) == canonical
        if space.is_valid(drawn):
            assert canonical == drawn


class Discarding:
    """The space as the search saw it before canonical forms: a point that breaks an
    implication is pruned."""

    def __init__(self, space: Template) -> None:
        self._space = space

    def canonical(self, params: dict[str, Any]) -> dict[str, Any]:
        return dict(params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._space, name)


def test_the_search_proposes_the_pipelined_structure_as_often_as_the_others() -> None:
    count = 30

    def structures(space: Any) -> Counter[str]:
        search = TemplateSearch([space], seed=1)
        proposals = search.propose([], count, 0, lambda p: False)
        assert len(proposals) == count and all(SOFTMAX.is_valid(p.params) for p in proposals)
        return Counter(str(p.params["fuse"]) for p in proposals)

    canonical = structures(SOFTMAX)
    assert min(canonical[fuse] for fuse in ("none", "online", "pipelined")) >= count // 5, canonical
    # pruned, a pipelined draw survives only with the four values it ignores just so
    assert structures(Discarding(SOFTMAX))["pipelined"] < canonical["pipelined"] // 2
