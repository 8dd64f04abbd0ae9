"""The one-edit neighbourhood's enumeration: every edit of a parsed module's function
bodies, by grammar node (components/env/tool_sets/fix_search/neighbourhood.py lists the
kinds, ranks and renders them)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from components import pyast

# ----------------------------------------------------------------------------- priors

PRIORS: dict[str, float] = {
    "bool": 3.0,
    "cmp_near": 3.0,  # < <=, > >=, == !=, in / not in, is / is not
    "cmp_flip": 2.0,  # < >, <= >=, < >=, > <=
    "cmp_far": 1.0,  # an ordering <-> an equality
    "arith_near": 2.5,  # + -, * / //, // %, * **
    "arith_far": 1.0,
    "const": 2.5,
    "const_sentinel": 1.5,  # 0 <-> None
    "bound_drop": 2.5,  # e + 1 -> e
    "bound": 2.0,  # e -> e +- 1
    "not_drop": 2.5,
    "not_add": 2.0,
    "args": 2.0,
    "swap": 1.5,
    "call_dual": 2.5,
    "call_drop": 0.8,
    "ret_end": 2.5,  # a function that falls off its end returns a bound name
    "ret_pass": 2.0,
    "ret_bare": 1.5,
    "del_exit": 2.0,  # a return / break / continue inside a loop
    "del_return": 1.2,  # any other return but the function's last statement
    "del_simple": 0.6,
    "del_block": 0.3,
    "var": 1.0,
    "var_role": 0.6,  # +: both names used the same way (a sequence / a number); -: not
    "var_before": 0.3,  # +: the name is bound before the site's line (or a parameter)
}

# ----------------------------------------------------------------------------- families

_CMP = (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq)
_CMP_FAMILIES = (_CMP, (ast.In, ast.NotIn), (ast.Is, ast.IsNot))
_CMP_NEAR = {frozenset(p) for p in [(ast.Lt, ast.LtE), (ast.Gt, ast.GtE), (ast.Eq, ast.NotEq),
                                     (ast.In, ast.NotIn), (ast.Is, ast.IsNot)]}  # fmt: skip
_CMP_FLIP = {frozenset(p) for p in [(ast.Lt, ast.Gt), (ast.LtE, ast.GtE), (ast.Lt, ast.GtE),
                                     (ast.Gt, ast.LtE)]}  # fmt: skip
_ARITH_FAMILIES = (
    (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow),
    (ast.LShift, ast.RShift),
    (ast.BitAnd, ast.BitOr, ast.BitXor),
)
_ARITH_NEAR = {frozenset(p) for p in [(ast.Add, ast.Sub), (ast.Mult, ast.Div),
                                       (ast.Mult, ast.FloorDiv), (ast.Div, ast.FloorDiv),
                                       (ast.FloorDiv, ast.Mod), (ast.Mult, ast.Pow),
                                       (ast.LShift, ast.RShift)]}  # fmt: skip
_COMMUTATIVE = (ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor)
# Antonym pairs among Python's builtins and str / list methods.
_DUALS = dict(
    [
        ("min", "max"),
        ("any", "all"),
        ("lower", "upper"),
        ("startswith", "endswith"),
        ("isupper", "islower"),
        ("lstrip", "rstrip"),
        ("find", "rfind"),
        ("index", "rindex"),
        ("ljust", "rjust"),
        ("floor", "ceil"),
        ("append", "extend"),
        ("pop", "popleft"),
        ("keys", "values"),
        ("sorted", "reversed"),
    ]  # fmt: skip
)
_DUALS |= {b: a for a, b in _DUALS.items()}
_SYMBOL = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
    ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitXor: "^",
    ast.BitAnd: "&", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
    ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
    ast.And: "and", ast.Or: "or",
}  # fmt: skip


# ----------------------------------------------------------------------------- enumeration


@dataclass(frozen=True)
class Edit:
    """One edit as a slot of the parsed tree set to a new value (undone after rendering)."""

    kind: str
    prior: str | float
    node: ast.AST  # where it is (line; the enclosing function)
    holder: ast.AST | list
    key: str | int
    new: object
    description: str


class Scope:
    """The parsed module with, per node, its parent slot and its enclosing function."""

    def __init__(self, tree: ast.Module) -> None:
        self.slot: dict[int, tuple[ast.AST | list, str | int]] = {}
        self.function: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for node in ast.walk(tree):
            for name, value in ast.iter_fields(node):
                if isinstance(value, ast.AST):
                    self.slot[id(value)] = (node, name)
                elif isinstance(value, list):
                    for i, item in enumerate(value):
                        if isinstance(item, ast.AST):
                            self.slot[id(item)] = (value, i)
        self.functions = [n for n in ast.walk(tree) if isinstance(n, FUNCTIONS)]
        for fn in self.functions:  # outer first (BFS): an inner function overwrites
            for node in ast.walk(fn):
                if node is not fn:
                    self.function[id(node)] = fn
        docstrings = set()
        for fn in self.functions:
            if (
                fn.body
                and isinstance(fn.body[0], ast.Expr)
                and isinstance(fn.body[0].value, ast.Constant)
            ):
                docstrings |= {id(n) for n in ast.walk(fn.body[0])}
        self.nodes = [
            n for fn in self.functions for n in ast.walk(fn)
            if n is not fn and self.function.get(id(n)) is fn and id(n) not in docstrings
        ]  # fmt: skip
        self._bound: dict[int, list[str]] = {}

    def bound_names(self, fn: ast.AST) -> list[str]:
        """Names bound in `fn` and the functions around it, in order of first binding."""
        if id(fn) not in self._bound:
            names: list[str] = []
            outer = self.function.get(id(fn))
            if outer is not None:
                names += self.bound_names(outer)
            a = fn.args
            for arg in [*a.posonlyargs, *a.args, a.vararg, *a.kwonlyargs, a.kwarg]:
                if arg is not None:
                    names.append(arg.arg)
            for node in ast.walk(fn):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.append(node.id)
            self._bound[id(fn)] = list(dict.fromkeys(names))
        return self._bound[id(fn)]


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _src(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 40 else text[:37] + "..."


def line_of(node: ast.AST) -> int:
    return getattr(node, "lineno", 0)


def _replace(scope: Scope, node: ast.AST, new: ast.AST, kind: str, prior, description: str):
    holder, key = scope.slot[id(node)]
    return Edit(kind, prior, node, holder, key, new, f"line {line_of(node)}: {description}")


def _operator_edits(scope: Scope, node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            family = next(f for f in _CMP_FAMILIES if type(op) in f)
            for alt in family:
                if alt is type(op):
                    continue
                pair = frozenset((type(op), alt))
                prior = (
                    "cmp_near"
                    if pair in _CMP_NEAR
                    else "cmp_flip"
                    if pair in _CMP_FLIP
                    else "cmp_far"
                )
                yield Edit("cmp", prior, node, node.ops, i, alt(),
                            f"line {line_of(node)}: {_SYMBOL[type(op)]} -> {_SYMBOL[alt]}")  # fmt: skip
    elif isinstance(node, ast.BinOp | ast.AugAssign):
        family = next((f for f in _ARITH_FAMILIES if type(node.op) in f), ())
        suffix = "=" if isinstance(node, ast.AugAssign) else ""
        for alt in family:
            if alt is type(node.op):
                continue
            near = frozenset((type(node.op), alt)) in _ARITH_NEAR
            yield Edit("arith", "arith_near" if near else "arith_far", node, node, "op", alt(),
                        f"line {line_of(node)}: {_SYMBOL[type(node.op)]}{suffix} -> "
                        f"{_SYMBOL[alt]}{suffix}")  # fmt: skip
    elif isinstance(node, ast.BoolOp):
        alt = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield Edit("bool", "bool", node, node, "op", alt(),
                    f"line {line_of(node)}: {_SYMBOL[type(node.op)]} -> {_SYMBOL[alt]}")  # fmt: skip


def _condition_edits(scope: Scope, node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield _replace(
            scope, node, node.operand, "not", "not_drop", f"dropped `not` in {_src(node)}"
        )
    tests: list[tuple[ast.AST | list, str | int, ast.expr]] = []
    if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
        tests.append((node, "test", node.test))
    elif isinstance(node, ast.comprehension):
        tests += [(node.ifs, i, cond) for i, cond in enumerate(node.ifs)]
    elif isinstance(node, ast.BoolOp):  # a missing `not` on one operand
        tests += [(node.values, i, v) for i, v in enumerate(node.values)]
    for holder, key, test in tests:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            continue
        yield Edit("not", "not_add", test, holder, key, ast.UnaryOp(ast.Not(), test),
                    f"line {line_of(test)}: negated {_src(test)}")  # fmt: skip


def _is_int(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int


def _signed_int(node: ast.AST | None) -> int | None:
    """The value of an integer literal, `-1` (a minus and a literal in the tree) included."""
    if _is_int(node):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and _is_int(node.operand):
        return -node.operand.value
    return None


def _parent(scope: Scope, node: ast.AST) -> ast.AST | None:
    holder, _ = scope.slot.get(id(node), (None, None))
    return holder if isinstance(holder, ast.AST) else None


def _bound_positions(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
        # d[i, j]: each part of a multi-dimensional index is an index position of its own
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        return [e for e in parts if not isinstance(e, ast.Slice | ast.Starred)]
    if isinstance(node, ast.Slice):
        return [e for e in (node.lower, node.upper) if e is not None]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
        return [a for a in node.args if not isinstance(a, ast.Starred)]
    return []


def _value_edits(scope: Scope, node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        yield _replace(scope, node, ast.Constant(not node.value), "const", "const",
                       f"{node.value} -> {not node.value}")  # fmt: skip
    sentinel = isinstance(node, ast.Constant) and (node.value is None or node.value == 0)
    sentinel = sentinel and type(node.value) is not float and type(node.value) is not bool
    parent = _parent(scope, node)
    identity = isinstance(parent, ast.Compare) and any(
        isinstance(op, ast.Is | ast.IsNot) for op in parent.ops
    )  # `x is 0` is never meant
    if sentinel and not identity:
        other = 0 if node.value is None else None  # the two "nothing yet" sentinels
        yield _replace(scope, node, ast.Constant(other), "const", "const_sentinel",
                       f"{node.value} -> {other}")  # fmt: skip
    if _signed_int(node) is not None and _signed_int(_parent(scope, node)) is None:
        for delta in (1, -1):
            value = _signed_int(node) + delta
            new = (
                ast.Constant(value) if value >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-value))
            )
            yield _replace(scope, node, new, "const", "const", f"{_src(node)} -> {value}")
    for e in _bound_positions(node):
        if _is_int(e) or (isinstance(e, ast.UnaryOp) and _is_int(e.operand)):
            continue  # const's +-1
        off = isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add | ast.Sub) and _is_int(e.right)
        if off and e.right.value == 1:
            yield _replace(scope, e, e.left, "bound", "bound_drop", f"{_src(e)} -> {_src(e.left)}")
            continue
        for op in (ast.Add, ast.Sub):
            new = ast.BinOp(e, op(), ast.Constant(1))
            yield _replace(scope, e, new, "bound", "bound", f"{_src(e)} -> {_src(new)}")


_SEQUENCE_CALLS = {"len", "enumerate", "zip", "sorted", "reversed", "sum", "set", "list", "iter"}


def _roles(fn: ast.AST) -> dict[str, set[str]]:
    """Per name, how `fn` uses it: "seq" (iterated, indexed, len()-ed, a method called on
    it, assigned a collection) or "num" (an index, a range() bound, in arithmetic with an
    int literal, assigned one). A cheap stand-in for types when a name is replaced."""
    roles: dict[str, set[str]] = {}

    def mark(node: ast.AST | None, role: str) -> None:
        if isinstance(node, ast.Name):
            roles.setdefault(node.id, set()).add(role)

    collections = (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.ListComp, ast.DictComp,
                   ast.SetComp, ast.GeneratorExp)  # fmt: skip
    for node in ast.walk(fn):
        if isinstance(node, ast.For | ast.comprehension):
            mark(node.iter, "seq")
            call = node.iter
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                mark(node.target, "num" if call.func.id == "range" else "")
        elif isinstance(node, ast.Subscript):
            mark(node.value, "seq")
            mark(node.slice, "num")
        elif isinstance(node, ast.Slice):
            mark(node.lower, "num")
            mark(node.upper, "num")
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in _SEQUENCE_CALLS:
                for a in node.args:
                    mark(a, "seq")
            if isinstance(node.func, ast.Name) and node.func.id == "range":
                for a in node.args:
                    mark(a, "num")
            if isinstance(node.func, ast.Attribute):
                mark(node.func.value, "seq")
        elif isinstance(node, ast.BinOp) and (_is_int(node.left) or _is_int(node.right)):
            mark(node.left, "num")
            mark(node.right, "num")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign) and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            role = ("seq" if isinstance(node.value, collections) else
                    "num" if _signed_int(node.value) is not None else "")  # fmt: skip
            for t in targets:
                mark(t, role)
    return {k: v - {""} for k, v in roles.items()}


def _first_bound(fn: ast.AST) -> dict[str, int]:
    """Per name, the line it is first bound on in `fn` (its parameters: the def's line)."""
    first = {a.arg: line_of(fn) for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            first[node.id] = min(first.get(node.id, line_of(node)), line_of(node))
    return first


def _name_edits(scope: Scope, node: ast.AST, facts: dict) -> Iterator[Edit]:
    if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
        return
    holder, key = scope.slot[id(node)]
    if isinstance(holder, ast.Call) and key == "func":
        return  # a callee: `call`'s
    fn = scope.function[id(node)]
    if id(fn) not in facts:
        facts[id(fn)] = (_roles(fn), _first_bound(fn))
    roles, first = facts[id(fn)]
    mine = roles.get(node.id, set())
    for name in scope.bound_names(fn):
        if name == node.id:
            continue
        theirs = roles.get(name, set())
        prior = PRIORS["var"]
        if mine and theirs:
            prior += PRIORS["var_role"] * (1 if mine & theirs else -1)
        prior += PRIORS["var_before"] * (first.get(name, 0) < line_of(node))
        yield Edit("var", prior, node, holder, key, ast.Name(name, ast.Load()),
                    f"line {line_of(node)}: {node.id} -> {name}")  # fmt: skip


def _order_edits(scope: Scope, node: ast.AST) -> Iterator[Edit]:
    if isinstance(node, ast.Call):
        args = node.args
        for i in range(len(args)):
            for j in range(i + 1, len(args)):
                a, b = args[i], args[j]
                if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
                    continue
                if ast.dump(a) == ast.dump(b):
                    continue
                new = list(args)
                new[i], new[j] = b, a
                yield Edit("args", "args", node, node, "args", new,
                            f"line {line_of(node)}: swapped arguments {_src(a)}, {_src(b)}")  # fmt: skip
    if (
        isinstance(node, ast.BinOp)
        and not isinstance(node.op, _COMMUTATIVE)
        and ast.dump(node.left) != ast.dump(node.right)
    ):
        new = ast.BinOp(node.right, node.op, node.left)
        yield _replace(scope, node, new, "swap", "swap", f"{_src(node)} -> operands swapped")


def _call_edits(scope: Scope, node: ast.AST) -> Iterator[Edit]:
    if not isinstance(node, ast.Call):
        return
    func = node.func
    if isinstance(func, ast.Name) and func.id in _DUALS:
        yield Edit("call", "call_dual", node, node, "func", ast.Name(_DUALS[func.id], ast.Load()),
                    f"line {line_of(node)}: {func.id}() -> {_DUALS[func.id]}()")  # fmt: skip
    elif isinstance(func, ast.Attribute) and func.attr in _DUALS:
        new = ast.Attribute(func.value, _DUALS[func.attr], ast.Load())
        yield Edit("call", "call_dual", node, node, "func", new,
                    f"line {line_of(node)}: .{func.attr}() -> .{_DUALS[func.attr]}()")  # fmt: skip
    if len(node.args) == 1 and not node.keywords and not isinstance(node.args[0], ast.Starred):
        holder, _ = scope.slot[id(node)]
        if not isinstance(holder, ast.Expr):  # a call statement's value is its effect
            yield _replace(scope, node, node.args[0], "call", "call_drop",
                           f"{_src(node)} -> {_src(node.args[0])}")  # fmt: skip


def _falls_off(body: list[ast.stmt]) -> bool:
    last = body[-1]
    if isinstance(last, ast.Return | ast.Raise):
        return False
    endless = isinstance(last, ast.While) and isinstance(last.test, ast.Constant)
    return not (endless and last.test.value)


def _statement_edits(scope: Scope, node: ast.AST) -> Iterator[Edit]:
    """`ret` and `del`: statements added or removed (`node` is a statement holder)."""
    fn = node if isinstance(node, FUNCTIONS) else scope.function.get(id(node))
    if fn is None:
        return
    names = scope.bound_names(fn)
    values = [*names, *_returned_literals(fn)]
    if isinstance(node, FUNCTIONS) and _falls_off(node.body):
        # the names assigned last are likelier results than the parameters
        assigned = [n for n in names if n not in {a.arg for a in ast.walk(node.args)
                                                   if isinstance(a, ast.arg)}]  # fmt: skip
        ordered = [*reversed(assigned), *[n for n in values if n not in assigned]]
        for name in ordered:
            new = [*node.body, ast.Return(_value(name))]
            prior = PRIORS["ret_end"] - (0.0 if name in assigned else 1.0)
            yield Edit("ret", prior, node.body[-1], node, "body", new,
                        f"line {node.body[-1].end_lineno + 1}: added `return {name}`")  # fmt: skip
    for field in ("body", "orelse", "finalbody"):
        stmts = getattr(node, field, None)
        if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
            continue
        for i, stmt in enumerate(stmts):
            if (
                isinstance(node, FUNCTIONS)
                and i == 0
                and isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
            ):
                continue  # the docstring
            yield from _statement_replacements(scope, node, field, stmts, i, values, fn)


def _returned_literals(fn: ast.AST) -> list[str]:
    """Literals `fn` returns somewhere (source text), True and False both if either: what a
    missing `return` may have returned besides a bound name."""
    out = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            value = node.value.value
            out += ["True", "False"] if type(value) is bool else [repr(value)]
    return list(dict.fromkeys(out))


def _value(text: str) -> ast.expr:
    return pyast.parse(text, mode="eval").body


def _statement_replacements(scope, node, field, stmts, i, names, fn) -> Iterator[Edit]:
    stmt = stmts[i]
    if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Return) and stmt.value is None):
        prior = "ret_pass" if isinstance(stmt, ast.Pass) else "ret_bare"
        for name in names:
            yield Edit("ret", prior, stmt, stmts, i, ast.Return(_value(name)),
                        f"line {line_of(stmt)}: `{_src(stmt)}` -> `return {name}`")  # fmt: skip
        if isinstance(stmt, ast.Pass):
            return
    in_loop = isinstance(node, ast.For | ast.While | ast.AsyncFor) or _inside_loop(scope, node, fn)
    if isinstance(stmt, ast.Return | ast.Break | ast.Continue) and in_loop:
        prior = "del_exit"
    elif isinstance(stmt, ast.Return):
        if node is fn and i == len(stmts) - 1:
            return  # the function's own result
        prior = "del_return"
    elif isinstance(stmt, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Break
                    | ast.Continue | ast.Return):  # fmt: skip
        prior = "del_simple"
    else:
        prior = "del_block"
    new = [*stmts[:i], *stmts[i + 1 :]] or [ast.Pass()]
    yield Edit("del", prior, stmt, node, field, new,
                f"line {line_of(stmt)}: removed `{_src(stmt).splitlines()[0]}`")  # fmt: skip


def _inside_loop(scope: Scope, node: ast.AST, fn: ast.AST) -> bool:
    while node is not fn and id(node) in scope.slot:
        if isinstance(node, ast.For | ast.While | ast.AsyncFor):
            return True
        holder, _ = scope.slot[id(node)]
        if isinstance(holder, list):  # a statement list: find its owner
            node = next(
                (p for p in ast.walk(fn) if any(v is holder for _, v in ast.iter_fields(p))), fn
            )
        else:
            node = holder
    return False


def enumerate_edits(scope: Scope) -> Iterator[Edit]:
    facts: dict = {}
    for fn in scope.functions:
        yield from _statement_edits(scope, fn)
    for node in scope.nodes:
        yield from _operator_edits(scope, node)
        yield from _condition_edits(scope, node)
        yield from _value_edits(scope, node)
        yield from _order_edits(scope, node)
        yield from _call_edits(scope, node)
        yield from _name_edits(scope, node, facts)
        if isinstance(node, ast.stmt) and not isinstance(node, FUNCTIONS):
            yield from _statement_edits(scope, node)
