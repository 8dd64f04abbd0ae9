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


# Packages from the ground floor up: a module may import its own package, a package below
# it, or a top-level module (components/*.py); never a package above (issue 34). A
# package's command line (`__main__.py`) is an entry point and may use any of them.
LAYERS = (
    "components.sandbox",
    "components.tasks",
    "components.verifier",
    "components.env",
    "components.scripted",
    "components.env_service",
    "components.mining",
    "components.policy",
    "components.rollout",
    "components.serve",
    "components.data",
    "components.train",
    "components.evaluate",
    "components.promote",
    "components.launch",
    "flows",
)
MAX_FILE_LINES = 600
LONG_FILES_ALLOWED = {"components/tasks/families.py"}  # function-family data tables
MAX_PARAMETERS = 8
MAX_ENV_LINES = 5000


def _layer(module: str) -> int | None:
    for i, package in enumerate(LAYERS):
        if module == package or module.startswith(package + "."):
            return i
    return None


def _lazy_module_names(path: Path) -> set[str]:
    """Modules named in strings ("components.x.y", "components.x.y:function"): lazy
    registries (the preset's sections, the CLI's commands) import them by name."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            head = node.value.split(":")[0]
            if head.startswith(("components.", "flows.")) and " " not in head:
                names.add(head)
    return names


def layering_violations() -> list[str]:
    modules = _modules()
    out = []
    for name, path in modules.items():
        if name.endswith(".__main__") or name == "components.cli":
            continue
        imported = _imports(path, name, modules) | {
            m for m in _lazy_module_names(path) if m in modules
        }
        # `from components.env import episode` names the package and the module: keep the module
        imported = {m for m in imported if not any(o.startswith(m + ".") for o in imported)}
        for target in sorted(imported):
            if name.startswith("components") and target.startswith("flows"):
                out.append(f"{name} -> {target} (a component imports a flow)")
                continue
            mine, theirs = _layer(name), _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{name} -> {target} (runs back up: {LAYERS[theirs]} is above)")
    return out


def long_files() -> list[str]:
    out = []
    for path in _modules().values():
        rel = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_FILE_LINES and rel not in LONG_FILES_ALLOWED:
            out.append(f"{rel} ({lines} lines)")
    return out


def many_parameter_functions() -> list[str]:
    out = []
    for path in _modules().values():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            params = [p for p in params if p is not None and p.arg not in ("self", "cls")]
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            said_why = first >= 2 and lines[first - 2].strip().startswith("# long:")
            if len(params) > MAX_PARAMETERS and not said_why:
                rel = path.relative_to(ROOT)
                out.append(f"{rel}:{node.lineno} {node.name} ({len(params)} parameters)")
    return out


def env_lines() -> int:
    return sum(len(p.read_text().splitlines()) for p in (ROOT / "components/env").rglob("*.py"))


def test_no_import_runs_back_up():
    assert layering_violations() == []


def test_the_layering_check_finds_an_import_running_up(tmp_path, monkeypatch):
    """The check can fail: a task module that imports the environment is reported."""
    for folder in ("components", "components/tasks", "components/env"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "components/tasks/task.py").write_text("from components.env import episode\n")
    (tmp_path / "components/env/episode.py").write_text("from components.tasks import task\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    monkeypatch.setattr(__import__(__name__), "PACKAGES", ("components",))
    assert layering_violations() == [
        "components.tasks.task -> components.env.episode (runs back up: components.env is above)"
    ]


def test_no_file_over_600_lines():
    assert long_files() == []


def test_no_function_over_8_parameters_without_a_reason():
    assert many_parameter_functions() == []


def test_the_environment_package_stays_under_5k_lines():
    assert env_lines() < MAX_ENV_LINES
