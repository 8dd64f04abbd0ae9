"""The code keeps its shape: no import cycles between modules, no function too long to read.

Both are read from the source (ast), so the test is fast and needs nothing installed.
- Imports: every `import` / `from ... import` of a project module counts, at module level or
  inside a function (a lazy import is still a dependency: it only moves the cost). A cycle
  means two modules that cannot be understood, tested or moved apart.
- Length: a function over MAX_LINES lines (decorators and docstring included) is split
  where it holds several steps, or says why it is long in a `# long: ...` comment on the
  line above its `def` (data tables, for one).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("components", "flows")
MAX_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Project modules `name` imports (a `from pkg import mod` of a submodule counts as
    importing the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in found if m in modules and m != name}


def import_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    modules = _modules()
    graph = {name: _imports(path, name, modules) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def long_functions() -> list[str]:
    out = []
    for path in [*_modules().values(), *sorted((ROOT / "bench").glob("*.py"))]:
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = node.end_lineno - first + 1
            said_why = first >= 2 and lines[first - 2].strip().startswith("# long:")
            if length > MAX_LINES and not said_why:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_import_cycles():
    assert import_cycles() == []


def test_the_cycle_finder_finds_a_cycle(tmp_path, monkeypatch):
    """The check can fail: two modules that import each other are reported."""
    pkg = tmp_path / "components"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from components import b\n")
    (pkg / "b.py").write_text("def f():\n    from components.a import x\n")
    (pkg / "c.py").write_text("import components.a\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "PACKAGES", ("components",))
    assert import_cycles() == [["components.a", "components.b"]]


def test_no_function_over_80_lines_without_a_reason():
    assert long_functions() == []
