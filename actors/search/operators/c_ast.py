"""C source as tree-sitter-c parses it, and edits by byte ranges.

`CSource` parses a kernel once and answers what the operators ask of its syntax: the
function definitions (the kernel is `kernel`), a function's parameters (which are pointers,
const, restrict), its `for` loops with their induction variable, start, bound and step and
the loops around them, the `#pragma` lines before a statement, the declarations in scope.
The dependence questions (what a loop reads and writes, its reductions) are
`dependence.py`'s.

Every change is an `Edit` of a byte range of the parent, applied back to front, so that
comments and formatting outside the edited ranges survive byte for byte; a child is parsed
again and must hold no ERROR or MISSING node. Text is never edited with regexes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import tree_sitter_c
from tree_sitter import Language, Node, Parser

from actors.search.operators.protocol import Refuse

LANGUAGE = Language(tree_sitter_c.language())
BLOCK_PARENTS = frozenset({"compound_statement", "translation_unit"})
"""Where a statement may be preceded by other statements (or a pragma line) as it is."""
LOOP_NODES = frozenset({"for_statement", "while_statement", "do_statement"})
FLOAT_TYPES = frozenset({"float", "double"})


@dataclass(frozen=True)
class Edit:
    """Replace bytes [start, end) of the parent by `text` (an insertion where start == end)."""

    start: int
    end: int
    text: str


def apply_edits(data: bytes, edits: Sequence[Edit]) -> bytes:
    """The bytes with every edit applied, back to front. Edits may not overlap; insertions
    at one point keep the order they are given in."""
    ordered = sorted(enumerate(edits), key=lambda e: (e[1].start, e[1].end, e[0]))
    for (_, a), (_, b) in itertools.pairwise(ordered):
        if b.start < a.end:
            raise ValueError(f"overlapping edits at bytes {a.start}-{a.end} and {b.start}")
    out = data
    for _, edit in reversed(ordered):
        out = out[: edit.start] + edit.text.encode() + out[edit.end :]
    return out


def parse(data: bytes) -> Node:
    return Parser(LANGUAGE).parse(data).root_node


def broken_nodes(root: Node) -> list[str]:
    """Where an ERROR or MISSING node lies, as 'line:column' (1-based)."""
    found: list[str] = []

    def visit(node: Node) -> None:
        if node.is_error or node.is_missing:
            found.append(f"{node.start_point.row + 1}:{node.start_point.column + 1}")
            return
        if node.has_error:
            for child in node.children:
                visit(child)

    visit(root)
    return found


def walk(node: Node) -> Iterator[Node]:
    """The node and all its descendants, in source order."""
    yield node
    for child in node.children:
        yield from walk(child)


def named_descendants(node: Node, kind: str) -> list[Node]:
    return [n for n in walk(node) if n.type == kind]


def inside(node: Node, outer: Node) -> bool:
    return outer.start_byte <= node.start_byte and node.end_byte <= outer.end_byte


def ancestors(node: Node) -> Iterator[Node]:
    parent = node.parent
    while parent is not None:
        yield parent
        parent = parent.parent


def declarator_name(node: Node | None) -> str | None:
    """The identifier a (pointer, array, function, init) declarator declares."""
    while node is not None and node.type != "identifier":
        node = node.child_by_field_name("declarator")
    return None if node is None else _text(node)


def _text(node: Node) -> str:
    raw = node.text
    return "" if raw is None else raw.decode()


@dataclass(frozen=True)
class Param:
    """A parameter of a function: its name, whether it is a pointer, whether what it points
    to is const, whether it is restrict-qualified, and where `restrict ` would go."""

    name: str
    node: Node
    pointer: bool
    const_target: bool
    restrict: bool
    const_pointer: bool
    name_start: int


@dataclass(frozen=True)
class Loop:
    """A `for` statement: its induction variable (None if its header is not one variable
    counted up or down), the start and bound expressions, the comparison, the step (None if
    not a constant), whether the header declares the variable, and the loop around it."""

    node: Node
    var: str | None
    start: Node | None
    bound: Node | None
    op: str
    step: int | None
    declares_var: bool
    parent: Loop | None

    @property
    def body(self) -> Node:
        body = self.node.child_by_field_name("body")
        assert body is not None
        return body

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.depth + 1

    def counts_up_from_zero(self, src: CSource) -> bool:
        """`for (v = 0; v < bound; ++v)`: the form whose range the analyses can name."""
        return (
            self.var is not None
            and self.start is not None
            and src.text(self.start) == "0"
            and self.op == "<"
            and self.bound is not None
            and self.step == 1
        )


class CSource:
    """One parsed C source. Byte offsets are those of its UTF-8 encoding."""

    def __init__(self, text: str) -> None:
        self.source = text
        self.data = text.encode()
        self.root = parse(self.data)
        broken = broken_nodes(self.root)
        if broken:
            raise Refuse("parse_error", f"the source does not parse (at {', '.join(broken[:3])})")

    def text(self, node: Node) -> str:
        return self.data[node.start_byte : node.end_byte].decode()

    def is_one(self, node: Node | None) -> bool:
        """Whether the node is the literal 1 (1, 1.0f, 1.f, ...)."""
        if node is None or node.type != "number_literal":
            return False
        try:
            return float(self.text(node).rstrip("fFlLuU")) == 1.0
        except ValueError:
            return False

    # functions and parameters ------------------------------------------------------

    def functions(self) -> dict[str, Node]:
        """Each function definition of the file by name, in source order."""
        found: dict[str, Node] = {}
        for node in self.root.children:
            if node.type == "function_definition":
                name = declarator_name(node.child_by_field_name("declarator"))
                if name is not None:
                    found[name] = node
        return found

    def kernel(self) -> Node:
        fn = self.functions().get("kernel")
        if fn is None:
            raise Refuse("no_kernel", "the source defines no function named kernel")
        return fn

    def params(self, fn: Node) -> list[Param]:
        declarator = fn.child_by_field_name("declarator")
        while declarator is not None and declarator.type != "function_declarator":
            declarator = declarator.child_by_field_name("declarator")
        if declarator is None:
            return []
        plist = declarator.child_by_field_name("parameters")
        params: list[Param] = []
        for decl in [] if plist is None else plist.named_children:
            if decl.type != "parameter_declaration":
                continue
            inner = decl.child_by_field_name("declarator")
            name = declarator_name(inner)
            if name is None or inner is None:
                continue
            pointer = inner.type == "pointer_declarator"
            qualifiers = [self.text(c) for c in inner.children if c.type == "type_qualifier"]
            before = [self.text(c) for c in decl.children if c.type == "type_qualifier"]
            target = inner.child_by_field_name("declarator") if pointer else inner
            assert target is not None
            params.append(
                Param(
                    name=name,
                    node=decl,
                    pointer=pointer,
                    const_target=pointer and "const" in before,
                    restrict=any(
                        q in ("restrict", "__restrict", "__restrict__") for q in qualifiers
                    ),
                    const_pointer="const" in qualifiers,
                    name_start=target.start_byte,
                )
            )
        return params

    def body(self, fn: Node) -> Node:
        body = fn.child_by_field_name("body")
        assert body is not None
        return body

    # loops ----------------------------------------------------------------------------

    def loops(self, node: Node) -> list[Loop]:
        """Every `for` statement inside `node`, in source order, each with its enclosing one."""
        found: list[Loop] = []

        def visit(n: Node, parent: Loop | None) -> None:
            for child in n.children:
                if child.type == "for_statement":
                    loop = self._loop(child, parent)
                    found.append(loop)
                    visit(child, loop)
                else:
                    visit(child, parent)

        visit(node, None)
        return found

    def _loop(self, node: Node, parent: Loop | None) -> Loop:
        init = node.child_by_field_name("initializer")
        cond = node.child_by_field_name("condition")
        update = node.child_by_field_name("update")
        var, start, declares = self._loop_init(init)
        if init is None and update is not None:
            target = update.child_by_field_name(
                "left" if update.type == "assignment_expression" else "argument"
            )
            var = self.text(target) if target is not None and target.type == "identifier" else None
        op, bound = "", None
        if var is not None and cond is not None and cond.type == "binary_expression":
            left, right = cond.child_by_field_name("left"), cond.child_by_field_name("right")
            operator = cond.child_by_field_name("operator")
            assert left is not None and right is not None and operator is not None
            op = self.text(operator)
            if left.type == "identifier" and self.text(left) == var:
                bound = right
            elif right.type == "identifier" and self.text(right) == var:
                bound, op = left, {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)
        step = self._loop_step(update, var) if var is not None else None
        if bound is None:
            var = None if step is None else var
        return Loop(node, var, start, bound, op, step, declares, parent)

    def _loop_init(self, init: Node | None) -> tuple[str | None, Node | None, bool]:
        if init is None:
            return None, None, False
        if init.type == "declaration":
            declarators = init.children_by_field_name("declarator")
            if len(declarators) == 1 and declarators[0].type == "init_declarator":
                name = declarators[0].child_by_field_name("declarator")
                value = declarators[0].child_by_field_name("value")
                if name is not None and name.type == "identifier":
                    return self.text(name), value, True
            return None, None, False
        if init.type == "assignment_expression":
            left, right = init.child_by_field_name("left"), init.child_by_field_name("right")
            operator = init.child_by_field_name("operator")
            if (
                left is not None
                and left.type == "identifier"
                and operator is not None
                and (self.text(operator) == "=")
            ):
                return self.text(left), right, False
        return None, None, False

    def _loop_step(self, update: Node | None, var: str) -> int | None:
        if update is None:
            return None
        if update.type == "update_expression":
            arg = update.child_by_field_name("argument")
            operator = update.child_by_field_name("operator")
            if arg is not None and operator is not None and self.text(arg) == var:
                return 1 if self.text(operator) == "++" else -1
            return None
        if update.type == "assignment_expression":
            left, right = update.child_by_field_name("left"), update.child_by_field_name("right")
            operator = update.child_by_field_name("operator")
            if left is None or right is None or operator is None or self.text(left) != var:
                return None
            if right.type == "number_literal" and self.text(operator) in ("+=", "-="):
                value = integer_literal(self.text(right))
                if value is not None:
                    return value if self.text(operator) == "+=" else -value
        return None

    # pragmas and where text goes ---------------------------------------------------

    def pragmas(self, stmt: Node) -> list[Node]:
        """The `#pragma` lines right before a statement, in source order."""
        found: list[Node] = []
        prev = stmt.prev_sibling
        while prev is not None and prev.type == "preproc_call":
            directive = prev.child_by_field_name("directive")
            if directive is None or self.text(directive) != "#pragma":
                break
            found.append(prev)
            prev = prev.prev_sibling
        return found[::-1]

    def pragma_words(self, pragma: Node) -> list[str]:
        arg = pragma.child_by_field_name("argument")
        return [] if arg is None else self.text(arg).replace("\\\n", " ").split()

    def has_pragma(self, stmt: Node, *words: str) -> bool:
        return any(self.pragma_words(p)[: len(words)] == list(words) for p in self.pragmas(stmt))

    def pragma_edit(self, pragma: Node, after_word: int, text: str) -> Edit:
        """Insert `text` into a pragma line after its n-th word (0-based; -1: at its end)."""
        arg = pragma.child_by_field_name("argument")
        assert arg is not None
        if after_word < 0:
            return Edit(arg.end_byte, arg.end_byte, text)
        raw = self.data[arg.start_byte : arg.end_byte]
        pos, seen = 0, -1
        while seen < after_word:
            while raw[pos : pos + 1].isspace():
                pos += 1
            while (
                pos < len(raw) and not raw[pos : pos + 1].isspace() and raw[pos : pos + 1] != b"("
            ):
                pos += 1
            seen += 1
        return Edit(arg.start_byte + pos, arg.start_byte + pos, text)

    def line_start(self, pos: int) -> int:
        return self.data.rfind(b"\n", 0, pos) + 1

    def indent(self, node: Node) -> str:
        """The white space before the node on its line ('' if something else precedes it)."""
        lead = self.data[self.line_start(node.start_byte) : node.start_byte]
        return lead.decode() if lead.strip() == b"" else ""

    def statement_start(self, stmt: Node) -> int:
        """Where a statement begins, its pragma lines included."""
        pragmas = self.pragmas(stmt)
        return (pragmas[0] if pragmas else stmt).start_byte

    def lines_start(self, stmt: Node) -> int:
        """Where a statement and its pragmas begin: the start of their first line when
        nothing else stands before them on it."""
        start = self.statement_start(stmt)
        at = self.line_start(start)
        return start if self.data[at:start].strip() else at

    def insert_lines_before(self, stmt: Node, lines: Sequence[str]) -> list[Edit]:
        """Lines (pragmas, declarations) put before a statement and its pragmas, indented as
        it is; a statement that is the unbraced body of another is braced first."""
        indent = self.indent(stmt)
        text = "".join(
            f"{indent}{line}\n" if not line.startswith("#") else f"{line}\n" for line in lines
        )
        start = self.statement_start(stmt)
        parent = stmt.parent
        if parent is not None and parent.type not in BLOCK_PARENTS:
            outer = self.indent(parent) if parent.type != "else_clause" else ""
            return [
                Edit(start, start, "{\n" + text + indent),
                Edit(stmt.end_byte, stmt.end_byte, f"\n{outer}}}"),
            ]
        at = self.line_start(start)
        if self.data[at:start].strip():
            return [Edit(start, start, "\n" + text + indent)]
        return [Edit(at, at, text)]

    def insert_lines_after(self, stmt: Node, lines: Sequence[str]) -> list[Edit]:
        """Statements put after a statement, indented as it is; a statement that is the
        unbraced body of another is braced first."""
        indent = self.indent(stmt)
        text = "".join(f"\n{indent}{line}" for line in lines)
        parent = stmt.parent
        if parent is not None and parent.type not in BLOCK_PARENTS:
            start = self.statement_start(stmt)
            outer = self.indent(parent) if parent.type != "else_clause" else ""
            return [
                Edit(start, start, "{\n" + indent),
                Edit(stmt.end_byte, stmt.end_byte, f"{text}\n{outer}}}"),
            ]
        return [Edit(stmt.end_byte, stmt.end_byte, text)]

    def include(self, line: str) -> list[Edit]:
        """An `#include` line put after the file's last include, unless the file has it."""
        includes = [n for n in self.root.children if n.type == "preproc_include"]
        if any(" ".join(self.text(n).split()) == " ".join(line.split()) for n in includes):
            return []
        at = includes[-1].end_byte if includes else 0
        return [Edit(at, at, line + "\n")]

    def replace_identifiers(self, node: Node, names: dict[str, str]) -> list[Edit]:
        """Edits renaming every use of the given identifiers inside `node`."""
        return [
            Edit(n.start_byte, n.end_byte, names[self.text(n)])
            for n in walk(node)
            if n.type == "identifier" and self.text(n) in names
        ]

    def rewritten(self, node: Node, edits: Sequence[Edit]) -> str:
        """The text of `node` with edits inside it applied (offsets are the file's)."""
        local = [Edit(e.start - node.start_byte, e.end - node.start_byte, e.text) for e in edits]
        return apply_edits(self.data[node.start_byte : node.end_byte], local).decode()

    # names and types -------------------------------------------------------------------

    def declared_names(self, node: Node) -> set[str]:
        """The names declared inside `node` (variables, arrays, pointers; its own loops')."""
        names: set[str] = set()
        for decl in named_descendants(node, "declaration"):
            for d in decl.children_by_field_name("declarator"):
                name = declarator_name(d)
                if name is not None:
                    names.add(name)
        return names

    def declared_types(self, fn: Node) -> dict[str, str]:
        """Each name declared in a function (its parameters too) and the base type it was
        declared with ('float', 'int64_t', ...; pointers as 'float *'). A name declared twice
        with different types maps to ''."""
        types: dict[str, str] = {}

        def note(name: str | None, base: str, pointer: bool) -> None:
            if name is None:
                return
            kind = f"{base} *" if pointer else base
            types[name] = kind if types.get(name, kind) == kind else ""

        for param in self.params(fn):
            type_node = param.node.child_by_field_name("type")
            note(param.name, "" if type_node is None else self.text(type_node), param.pointer)
        for decl in named_descendants(self.body(fn), "declaration"):
            type_node = decl.child_by_field_name("type")
            base = "" if type_node is None else self.text(type_node)
            for d in decl.children_by_field_name("declarator"):
                inner = d.child_by_field_name("declarator") if d.type == "init_declarator" else d
                pointer = inner is not None and inner.type in (
                    "pointer_declarator",
                    "array_declarator",
                )
                note(declarator_name(d), base, pointer)
        return types


def pragma_parts(text: str) -> tuple[list[str], list[str]]:
    """A pragma's words (`omp parallel for`) and its clauses (`schedule(static, 16)`)."""
    tokens: list[str] = []
    depth = 0
    current = ""
    for c in text.replace("\\\n", " "):
        if c.isspace() and depth == 0:
            tokens, current = ([*tokens, current] if current else tokens), ""
            continue
        if c == "(" and not current and tokens:
            current = tokens.pop()
        depth += {"(": 1, ")": -1}.get(c, 0)
        current += c
    tokens += [current] if current else []
    return [t for t in tokens if "(" not in t], [t for t in tokens if "(" in t]


def integer_literal(text: str) -> int | None:
    """The value of a C integer literal (suffixes allowed), None for anything else."""
    digits = text.rstrip("uUlL")
    try:
        return int(digits, 0) if digits and "." not in digits else None
    except ValueError:
        return None


def is_float_literal(text: str) -> bool:
    lowered = text.lower()
    if lowered.startswith("0x"):
        return "p" in lowered
    return any(c in lowered for c in ".ef")


def enclosing_loops(node: Node, loops: Sequence[Loop]) -> list[Loop]:
    """The loops (of `loops`) around a node, innermost first."""
    by_node = {loop.node.id: loop for loop in loops}
    return [by_node[a.id] for a in ancestors(node) if a.id in by_node]


def innermost(loops: Sequence[Loop]) -> list[Loop]:
    """The loops of the list that hold no other loop of it."""
    parents = {loop.parent.node.id for loop in loops if loop.parent is not None}
    return [loop for loop in loops if loop.node.id not in parents]
