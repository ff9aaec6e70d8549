"""Fuse adjacent loops over the same range into one.

A run of adjacent `for` loops with the same header range becomes one loop whose body holds
theirs in order, where `passes.fusable` allows it (no loop needs a scalar another
completes, and each array one of them writes is touched at the same element by both); the
later loops' counters are renamed to the first's, and a body whose declarations would
clash with an earlier one's stays a block of its own. Comments between the loops move into
the fused body. One sweep instead of several: what one loop writes is still in registers or
L1 when the next reads it.

Parameters: groups ("all": every maximal group of fusable loops, "first": only the first
two). Refusals: no_fusable_loops (with the first reason two adjacent loops may not fuse),
loop_has_pragma.
"""

from __future__ import annotations

from typing import ClassVar

from tree_sitter import Node

from actors.search.operators.base import Change, Job, SourceOperator
from actors.search.operators.c_ast import CSource, Edit, Loop, declarator_name
from actors.search.operators.dependence import aliases
from actors.search.operators.passes import INDENT, adjacent_runs, fusable
from actors.search.operators.protocol import ParamSpace, Refuse


class Fuse(SourceOperator):
    name = "fuse"
    SPACE: ClassVar[ParamSpace] = {"groups": ("all", "first")}

    def change(self, job: Job) -> Change:
        src, params = job.src, job.params
        fn, loops = job.kernel()
        known = aliases(src, fn)
        groups: list[list[Loop]] = []
        refused: list[Refuse] = []
        for run in adjacent_runs(src, loops):
            group: list[Loop] = []
            for loop in [*run, None]:
                if loop is not None and not src.pragmas(loop.node):
                    try:
                        for earlier in group:
                            fusable(src, earlier, loop, known)
                        group.append(loop)
                        if params["groups"] == "all" or len(group) < 2:
                            continue
                    except Refuse as why:
                        refused.append(why)
                elif loop is not None:
                    refused.append(Refuse("loop_has_pragma", "a loop of the run has pragmas"))
                if len(group) > 1:
                    groups.append(group)
                group = [] if loop is None or src.pragmas(loop.node) else [loop]
            if groups and params["groups"] == "first":
                break
        if not groups:
            detail = f": {refused[0].message}" if refused else ""
            raise Refuse("no_fusable_loops", f"no adjacent loops over one range may fuse{detail}")
        if params["groups"] == "first":
            groups = [groups[0][:2]]
        return Change(tuple(_fused(src, g) for g in groups), job.flags)


def _fused(src: CSource, group: list[Loop]) -> Edit:
    first = group[0]
    start = src.lines_start(first.node)
    at_line = start == src.line_start(start)
    indent = src.indent(first.node) if at_line else ""
    inner = indent + INDENT
    parts: list[str] = []
    declared: set[str] = set()
    for k, loop in enumerate(group):
        if k:
            between = src.data[group[k - 1].node.end_byte : src.statement_start(loop.node)]
            parts += [inner + c.strip() for c in between.decode().split("\n") if c.strip()]
        body = loop.body
        renames = {loop.var: first.var} if loop.var != first.var and loop.var and first.var else {}
        text = src.rewritten(body, src.replace_identifiers(body, renames))
        names = _top_declarations(src, body)
        if body.type != "compound_statement":
            parts.append(inner + text)
        elif names & declared:
            parts.append(inner + text.replace("\n" + indent, "\n" + inner))
        else:
            lines = text[1:-1].strip("\n").rstrip().split("\n")
            parts.append("\n".join(lines))
        declared |= names
    header = src.data[first.node.start_byte : first.body.start_byte].decode()
    text = f"{indent}{header}{{\n" + "\n".join(parts) + f"\n{indent}}}"
    return Edit(start, group[-1].node.end_byte, text)


def _top_declarations(src: CSource, body: Node) -> set[str]:
    names: set[str] = set()
    for child in body.named_children:
        if child.type == "declaration":
            for d in child.children_by_field_name("declarator"):
                name = declarator_name(d)
                if name is not None:
                    names.add(name)
    return names
