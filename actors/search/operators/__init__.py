"""Offline variation operators on C source (issue 32): edits of a user's plain C kernel that
the search composes, each a pure function of its parents, its parameters and the context.

`protocol` holds the `VariationOperator` protocol and its plain data; `c_ast` parses C
with tree-sitter-c and edits it by byte ranges; `dependence` proves loops independent and
finds their reductions; `passes` fuses and strip-mines adjacent loops; `helpers` renders the
C helpers of the project's cpu templates; one module per operator; `registry.OPERATORS`
names them. The verifier judges every child: an operator may propose something wrong.
"""
