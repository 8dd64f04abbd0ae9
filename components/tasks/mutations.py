"""AST bug-injection operators.

Each operator looks at a parsed module and lists its candidate edits (site + replacement);
an edit mutates that tree in place. To build mutant k we parse the source afresh, list the
operator's edits on that fresh tree and apply edit k, so the same (source, operator, k)
always gives the same mutant. The operator name is the task's bug class.

Only code inside function bodies is touched, never docstrings.
"""

from __future__ import annotations

import ast
import copy
import random
from collections.abc import Callable
from dataclasses import dataclass

from components import pyast


@dataclass(frozen=True)
class Edit:
    description: str  # human readable, e.g. "line 4: < -> <="
    lineno: int
    apply: Callable[[], None]  # mutates the tree the edit was listed on


@dataclass(frozen=True)
class Operator:
    name: str
    help: str
    edits: Callable[[ast.Module], list[Edit]]


@dataclass(frozen=True)
class Mutant:
    operator: str
    index: int  # which of the operator's edits on the source
    description: str
    lineno: int
    source: str  # ast.unparse of the mutated module (no trailing newline)


# ---------------------------------------------------------------------------- helpers


def _functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]


def _docstring_ids(tree: ast.Module) -> set[int]:
    ids = set()
    for node in [tree, *_functions(tree)]:
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            ids.add(id(body[0].value))
    return ids


def _body_nodes(tree: ast.Module) -> list[ast.AST]:
    """Nodes inside function bodies, in a deterministic (BFS) order, docstrings excluded."""
    skip = _docstring_ids(tree)
    out = []
    for fn in _functions(tree):
        for stmt in fn.body:
            for node in ast.walk(stmt):
                if id(node) not in skip:
                    out.append(node)
    return out


def _parents(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}


def _replace(parent: ast.AST, old: ast.AST, new: ast.AST) -> None:
    for name, value in ast.iter_fields(parent):
        if value is old:
            setattr(parent, name, new)
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is old:
                    value[i] = new
                    return
    raise ValueError("child not found in parent")


def _line(node: ast.AST) -> int:
    return getattr(node, "lineno", 0)


def _is_int(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    )


def _src(node: ast.AST) -> str:
    return ast.unparse(node)


_OP_SYMBOL = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
    ast.Mod: "%", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
    ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
    ast.And: "and", ast.Or: "or",
}  # fmt: skip


def _sym(op: type) -> str:
    return _OP_SYMBOL.get(op, op.__name__)


# ---------------------------------------------------------------------------- operators

_ARITH = {
    ast.Add: (ast.Sub,), ast.Sub: (ast.Add,), ast.Mult: (ast.Add, ast.FloorDiv),
    ast.Div: (ast.FloorDiv, ast.Mult), ast.FloorDiv: (ast.Div, ast.Mod),
    ast.Mod: (ast.FloorDiv,),
}  # fmt: skip


def arith_swap(tree: ast.Module) -> list[Edit]:
    edits = []
    for node in _body_nodes(tree):
        if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in _ARITH:
            for alt in _ARITH[type(node.op)]:

                def apply(node=node, alt=alt):
                    node.op = alt()

                desc = f"line {_line(node)}: {_sym(type(node.op))} -> {_sym(alt)}"
                edits.append(Edit(desc, _line(node), apply))
    return edits


_COMPARE = {
    ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt, ast.LtE), ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,), ast.NotIn: (ast.In,), ast.Is: (ast.IsNot,), ast.IsNot: (ast.Is,),
}  # fmt: skip


def comparison_swap(tree: ast.Module) -> list[Edit]:
    edits = []
    for node in _body_nodes(tree):
        if not isinstance(node, ast.Compare):
            continue
        for i, op in enumerate(node.ops):
            for alt in _COMPARE.get(type(op), ()):

                def apply(node=node, i=i, alt=alt):
                    node.ops[i] = alt()

                desc = f"line {_line(node)}: {_sym(type(op))} -> {_sym(alt)}"
                edits.append(Edit(desc, _line(node), apply))
    return edits


def boolop_swap(tree: ast.Module) -> list[Edit]:
    edits = []
    for node in _body_nodes(tree):
        if isinstance(node, ast.BoolOp):
            alt = ast.Or if isinstance(node.op, ast.And) else ast.And

            def apply(node=node, alt=alt):
                node.op = alt()

            desc = f"line {_line(node)}: {_sym(type(node.op))} -> {_sym(alt)}"
            edits.append(Edit(desc, _line(node), apply))
    return edits


def _bound_positions(tree: ast.Module) -> set[int]:
    """ids of expressions used as slice bounds, subscript indices or range() arguments."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Slice):
            ids.update(id(b) for b in (node.lower, node.upper) if b is not None)
        elif isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
            ids.add(id(node.slice))
        elif _is_call_to(node, "range"):
            ids.update(id(a) for a in node.args)
    return ids


def _is_call_to(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name


def constant_off_by_one(tree: ast.Module) -> list[Edit]:
    """Integer literals +-1 (bounds and indices are left to bound_off_by_one)."""
    bounds = _bound_positions(tree)
    parents = _parents(tree)
    edits = []
    for node in _body_nodes(tree):
        if not _is_int(node) or id(node) in bounds:
            continue
        parent = parents.get(id(node))
        if isinstance(parent, ast.UnaryOp) and id(parent) in bounds:
            continue
        for delta in (1, -1):

            def apply(node=node, delta=delta):
                node.value = node.value + delta

            desc = f"line {_line(node)}: {node.value} -> {node.value + delta}"
            edits.append(Edit(desc, _line(node), apply))
    return edits


def _shift(expr: ast.expr, delta: int) -> ast.expr:
    """expr + delta, folded into an existing literal where possible (i + 1 - 1 -> i)."""
    if _is_int(expr):
        return ast.Constant(expr.value + delta)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub) and _is_int(expr.operand):
        return ast.Constant(-expr.operand.value + delta)
    if (
        isinstance(expr, ast.BinOp)
        and isinstance(expr.op, ast.Add | ast.Sub)
        and _is_int(expr.right)
    ):
        sign = 1 if isinstance(expr.op, ast.Add) else -1
        value = sign * expr.right.value + delta
        if value == 0:
            return expr.left
        op = ast.Add() if value > 0 else ast.Sub()
        return ast.BinOp(expr.left, op, ast.Constant(abs(value)))
    op = ast.Add() if delta > 0 else ast.Sub()
    return ast.BinOp(copy.deepcopy(expr), op, ast.Constant(abs(delta)))


def bound_off_by_one(tree: ast.Module) -> list[Edit]:
    """Slice bounds, subscript indices and range() arguments +-1."""
    parents = _parents(tree)
    bounds = _bound_positions(tree)
    edits = []
    for node in _body_nodes(tree):
        if id(node) not in bounds:
            continue
        parent = parents[id(node)]
        for delta in (1, -1):

            def apply(node=node, parent=parent, delta=delta):
                _replace(parent, node, _shift(node, delta))

            desc = f"line {_line(node)}: {_src(node)} -> {_src(_shift(node, delta))}"
            edits.append(Edit(desc, _line(node), apply))
    return edits


def _local_names(fn: ast.FunctionDef) -> dict[str, int]:
    """Function-level variables -> first line where they get a value (params: def line).

    Comprehension targets are excluded: they are not in scope outside the comprehension.
    """
    first: dict[str, int] = {}
    for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
        first.setdefault(a.arg, fn.lineno)
    comp_targets = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.comprehension):
            comp_targets.update(id(n) for n in ast.walk(node.target))
    for node in ast.walk(fn):
        stored = isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
        if stored and id(node) not in comp_targets:
            first[node.id] = min(first.get(node.id, node.lineno), node.lineno)
    return first


def wrong_variable(tree: ast.Module) -> list[Edit]:
    """A variable read replaced by another variable already defined at that point."""
    skip = _docstring_ids(tree)
    parents = _parents(tree)
    edits = []
    for fn in _functions(tree):
        names = _local_names(fn)
        for node in ast.walk(fn):
            if id(node) in skip or not (
                isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
            ):
                continue
            if node.id not in names:
                continue
            parent = parents[id(node)]
            if isinstance(parent, ast.Call) and parent.func is node:
                continue
            for other in sorted(names):
                if other == node.id or names[other] > node.lineno:
                    continue

                def apply(node=node, other=other):
                    node.id = other

                desc = f"line {node.lineno}: {node.id} -> {other}"
                edits.append(Edit(desc, node.lineno, apply))
    return edits


def negation_flip(tree: ast.Module) -> list[Edit]:
    """Drop an existing `not`, or negate an if/elif/ternary/comprehension condition."""
    parents = _parents(tree)
    edits = []
    for node in _body_nodes(tree):
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            parent = parents[id(node)]

            def apply(node=node, parent=parent):
                _replace(parent, node, node.operand)

            desc = f"line {_line(node)}: dropped `not` in {_src(node)}"
            edits.append(Edit(desc, _line(node), apply))
        elif isinstance(node, ast.If | ast.IfExp) and not (
            isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
        ):

            def apply(node=node):
                node.test = ast.UnaryOp(ast.Not(), node.test)

            desc = f"line {_line(node)}: negated condition {_src(node.test)}"
            edits.append(Edit(desc, _line(node), apply))
    return edits


def _statement_lists(tree: ast.Module) -> list[list[ast.stmt]]:
    lists = []
    for fn in _functions(tree):
        for node in ast.walk(fn):
            for name in ("body", "orelse"):
                stmts = getattr(node, name, None)
                if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                    lists.append(stmts)
    return lists


def missing_return(tree: ast.Module) -> list[Edit]:
    """Delete a `return` (replaced by `pass` if it was the only statement of its block)."""
    edits = []
    for stmts in _statement_lists(tree):
        for node in list(stmts):
            if not isinstance(node, ast.Return):
                continue

            def apply(stmts=stmts, node=node):
                i = next(k for k, s in enumerate(stmts) if s is node)
                if len(stmts) == 1:
                    stmts[i] = ast.Pass()
                else:
                    del stmts[i]

            desc = f"line {node.lineno}: removed `{_src(node)}`"
            edits.append(Edit(desc, node.lineno, apply))
    return edits


def early_return(tree: ast.Module) -> list[Edit]:
    """The function's final return copied to the end of a preceding loop body (the
    classic 'return indented into the loop' bug)."""
    edits = []
    for fn in _functions(tree):
        body = fn.body
        if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
            continue
        ret = body[-1]
        for node in ast.walk(fn):
            if isinstance(node, ast.For | ast.While) and node.lineno < ret.lineno:

                def apply(node=node, ret=ret):
                    node.body.append(copy.deepcopy(ret))

                desc = f"line {node.lineno}: `{_src(ret)}` moved into the loop body"
                edits.append(Edit(desc, node.lineno, apply))
    return edits


def swapped_args(tree: ast.Module) -> list[Edit]:
    """Two adjacent positional call arguments exchanged."""
    edits = []
    for node in _body_nodes(tree):
        if not isinstance(node, ast.Call):
            continue
        args = node.args
        for i in range(len(args) - 1):
            a, b = args[i], args[i + 1]
            if isinstance(a, ast.Starred) or isinstance(b, ast.Starred) or _src(a) == _src(b):
                continue

            def apply(node=node, i=i):
                node.args[i], node.args[i + 1] = node.args[i + 1], node.args[i]

            desc = f"line {_line(node)}: swapped arguments {_src(a)}, {_src(b)}"
            edits.append(Edit(desc, _line(node), apply))
    return edits


def operand_swap(tree: ast.Module) -> list[Edit]:
    """Operands of a non-commutative operator exchanged (a - b -> b - a)."""
    edits = []
    for node in _body_nodes(tree):
        if (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Sub | ast.Div | ast.FloorDiv | ast.Mod)
            and _src(node.left) != _src(node.right)
        ):

            def apply(node=node):
                node.left, node.right = node.right, node.left

            desc = f"line {_line(node)}: {_src(node)} -> operands swapped"
            edits.append(Edit(desc, _line(node), apply))
    return edits


def _wrong_value(value: ast.expr) -> ast.expr | None:
    if isinstance(value, ast.Constant):
        v = value.value
        if isinstance(v, bool):
            return ast.Constant(not v)
        if isinstance(v, int):
            return ast.Constant(0 if v != 0 else 1)
        if isinstance(v, float):
            return ast.Constant(0.0 if v != 0.0 else 1.0)
        if isinstance(v, str):
            return ast.Constant("" if v else " ")
        if v is None:
            return ast.Constant(0)
        return None
    if isinstance(value, ast.UnaryOp) and _is_int(value.operand):
        return ast.Constant(0)
    if isinstance(value, ast.List | ast.Tuple) and value.elts:
        return type(value)(elts=[], ctx=ast.Load())
    if isinstance(value, ast.Subscript | ast.Name):
        return ast.Constant(0)
    return None


def wrong_init(tree: ast.Module) -> list[Edit]:
    """A variable's initial value (a top-level assignment before the first loop) changed."""
    edits = []
    for fn in _functions(tree):
        for stmt in fn.body:
            if isinstance(stmt, ast.For | ast.While):
                break
            if not isinstance(stmt, ast.Assign):
                continue
            values = [stmt.value]
            holders: list[tuple[ast.AST, str | int]] = [(stmt, "value")]
            if isinstance(stmt.value, ast.Tuple) and isinstance(stmt.targets[0], ast.Tuple):
                values = list(stmt.value.elts)
                holders = [(stmt.value, k) for k in range(len(values))]
            for value, (holder, slot) in zip(values, holders, strict=True):
                alt = _wrong_value(value)
                if alt is None or _src(alt) == _src(value):
                    continue

                def apply(holder=holder, slot=slot, alt=alt):
                    if isinstance(slot, int):
                        holder.elts[slot] = alt
                    else:
                        setattr(holder, slot, alt)

                desc = f"line {stmt.lineno}: initial value {_src(value)} -> {_src(alt)}"
                edits.append(Edit(desc, stmt.lineno, apply))
    return edits


_CALL_SWAP = {
    "min": "max", "max": "min", "any": "all", "all": "any", "lower": "upper",
    "upper": "lower", "startswith": "endswith", "endswith": "startswith",
    "isupper": "islower", "islower": "isupper", "append": "insert",
}  # fmt: skip


def call_swap(tree: ast.Module) -> list[Edit]:
    """A builtin or method replaced by its sibling (min/max, any/all, lower/upper, ...)."""
    edits = []
    for node in _body_nodes(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("min", "max", "any", "all"):
            old, new = func.id, _CALL_SWAP[func.id]

            def apply(func=func, new=new):
                func.id = new

        elif isinstance(func, ast.Attribute) and func.attr in _CALL_SWAP and func.attr != "append":
            old, new = func.attr, _CALL_SWAP[func.attr]

            def apply(func=func, new=new):
                func.attr = new

        else:
            continue
        edits.append(Edit(f"line {_line(node)}: {old}() -> {new}()", _line(node), apply))
    return edits


OPERATORS: list[Operator] = [
    Operator("arith_swap", "arithmetic operator replaced (+ -, * //, / //, % //)", arith_swap),
    Operator("comparison_swap", "comparison replaced (< <=, > >=, == !=, in, is)", comparison_swap),
    Operator("boolop_swap", "`and` and `or` exchanged", boolop_swap),
    Operator("constant_off_by_one", "integer literal +-1", constant_off_by_one),
    Operator("bound_off_by_one", "slice bound, index or range() argument +-1", bound_off_by_one),
    Operator("wrong_variable", "a variable read replaced by another variable", wrong_variable),
    Operator("negation_flip", "`not` dropped or a condition negated", negation_flip),
    Operator("missing_return", "a return statement deleted", missing_return),
    Operator("early_return", "final return moved into a loop body", early_return),
    Operator("swapped_args", "two call arguments exchanged", swapped_args),
    Operator("operand_swap", "operands of -, /, //, % exchanged", operand_swap),
    Operator("wrong_init", "initial value of a variable changed", wrong_init),
    Operator("call_swap", "min/max, any/all, lower/upper... exchanged", call_swap),
]
OPERATOR_NAMES = tuple(op.name for op in OPERATORS)


def get_operator(name: str) -> Operator:
    for op in OPERATORS:
        if op.name == name:
            return op
    raise KeyError(f"unknown mutation operator {name!r}; known: {', '.join(OPERATOR_NAMES)}")


def normalize(source: str) -> str:
    """The canonical text of a module (what mutants are compared and written as)."""
    return ast.unparse(pyast.parse(source))


def count_edits(source: str, operator: Operator) -> int:
    return len(operator.edits(pyast.parse(source)))


def apply_edit(source: str, operator: Operator, index: int) -> Mutant | None:
    """Mutant number `index` of `operator` on `source`; None if it is not a real change
    (same text as the original) or does not compile."""
    tree = pyast.parse(source)
    edits = operator.edits(tree)
    edit = edits[index]
    edit.apply()
    ast.fix_missing_locations(tree)
    try:
        text = ast.unparse(tree)
        compile(text, "<mutant>", "exec")
    except (SyntaxError, ValueError, TypeError):
        return None
    if text == normalize(source):
        return None
    return Mutant(operator.name, index, edit.description, edit.lineno, text)


def enumerate_mutants(source: str, operators: list[Operator] | None = None) -> list[Mutant]:
    """Every distinct mutant of `source` for the given operators (default: all)."""
    seen: set[str] = set()
    out = []
    for op in operators or OPERATORS:
        for k in range(count_edits(source, op)):
            m = apply_edit(source, op, k)
            if m is not None and m.source not in seen:
                seen.add(m.source)
                out.append(m)
    return out


def random_mutant(
    source: str, rng: random.Random, operators: list[Operator] | None = None
) -> Mutant | None:
    """One mutant picked with rng (operator first, then site); None if none applies."""
    ops = list(operators or OPERATORS)
    rng.shuffle(ops)
    for op in ops:
        order = list(range(count_edits(source, op)))
        rng.shuffle(order)
        for k in order:
            m = apply_edit(source, op, k)
            if m is not None:
                return m
    return None
