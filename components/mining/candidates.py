"""Candidate bugs: every edit of the bug operators inside a function the suite calls, in a
seeded order interleaved across functions, and the mutant's text with only the changed
code rewritten (so the reverse patch is the one line a developer would fix)."""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass

from components import pyast
from components.env.tool_sets.fix_search.fixes import edit_in_place
from components.mining.baseline import Repo
from components.mining.config import MineConfig
from components.tasks.mutations import OPERATORS, apply_edit, get_operator, normalize


@dataclass(frozen=True)
class Candidate:
    module: str  # path relative to the repository root
    function: str
    operator: str
    index: int
    lineno: int

    @property
    def name(self) -> str:
        return f"{self.module}:{self.function}:{self.operator}#{self.index}"


def function_nodes(tree: ast.Module) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function, outer before inner."""
    out: list[tuple[str, ast.AST]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(tree, "")
    return out


def first_lines(node: ast.AST) -> set[int]:
    """The lines a code object of this function may report as its first (decorators)."""
    return {node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))}


def candidates(repo: Repo, config: MineConfig) -> list[Candidate]:
    """Every operator edit inside a covered function, in the seeded, interleaved order."""
    ops = [get_operator(n) for n in config.operators] if config.operators else list(OPERATORS)
    groups: dict[tuple[str, str], list[Candidate]] = {}
    for module in sorted(repo.coverage):
        source = (repo.root / module).read_text()
        try:
            tree = pyast.parse(source)
        except SyntaxError:
            continue
        covered_lines = {int(k) for k in repo.coverage[module]}
        spans = [(name, node.lineno, node.end_lineno) for name, node in function_nodes(tree)
                 if first_lines(node) & covered_lines]  # fmt: skip
        for op in ops:
            for k, edit in enumerate(op.edits(pyast.parse(source))):
                inside = [s for s in spans if s[1] <= edit.lineno <= s[2]]
                if inside:  # the innermost covered function holding the edit
                    name = max(inside, key=lambda s: s[1])[0]
                    groups.setdefault((module, name), []).append(
                        Candidate(module, name, op.name, k, edit.lineno)
                    )
    rng = random.Random(config.seed)
    keys = sorted(groups)
    rng.shuffle(keys)
    for key in keys:
        rng.shuffle(groups[key])
    order = []
    for i in range(max((len(g) for g in groups.values()), default=0)):
        order += [groups[k][i] for k in keys if i < len(groups[k])]
    return order


def covering_tests(repo: Repo, cand: Candidate) -> list[str]:
    source = (repo.root / cand.module).read_text()
    files: set[str] = set()
    for name, node in function_nodes(pyast.parse(source)):
        if name == cand.function or name.startswith(cand.function + "."):
            for line in first_lines(node):
                files.update(repo.coverage[cand.module].get(str(line), []))
    return sorted(f for f in files if f in repo.test_files)


def mutant_text(source: str, cand: Candidate) -> str | None:
    mutant = apply_edit(source, get_operator(cand.operator), cand.index)
    if mutant is None:
        return None
    text = edit_in_place(source, mutant.source)
    try:
        return text if normalize(text) == mutant.source and text != source else None
    except SyntaxError:
        return None
