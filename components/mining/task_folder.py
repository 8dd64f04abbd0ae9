"""A kept mutant written as a task folder (docs/tasks.md): the mutated repository, the
failing test files as hidden tests (less the tests skipped or deselected before
mutation; the workspace's copies hold part of their tests out, so hidden is not visible),
the hidden cases, the reverse edit as the reference fix, the environment. The verifier adds
differential cases: the unmutated function (the reference fix) on new arguments
(components/verifier/hidden_cases.py)."""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import os
import re
import shutil
from dataclasses import replace
from pathlib import Path

from components import pyast
from components.mining.baseline import Repo
from components.mining.candidates import Candidate
from components.mining.config import MineConfig
from components.mining.layout import CONFIG_NAMES, TOOLS, copy_repo, walk_py
from components.tasks.task import (
    HIDDEN_CASES_FILE,
    Task,
    TaskLimits,
    TaskMetadata,
    load_task,
    task_spec,
)


def _test_name(nodeid: str) -> tuple[str, ...]:
    """("test_f",) or ("TestC", "test_m") for a node id (parameters dropped)."""
    return tuple(p.split("[", 1)[0] for p in nodeid.split("::")[1:])


def trim_skipped(text: str, names: set[tuple[str, ...]]) -> str | None:
    """The test file without the tests named (module functions or methods of module-level
    classes, decorators included); None when one cannot be found in the source (a test
    made by a base class, a generated one)."""
    tree = pyast.parse(text)
    spans = []
    for name in names:
        body, node = tree.body, None
        for part in name:
            node = next((n for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef
                                                     | ast.ClassDef) and n.name == part), None)  # fmt: skip
            if node is None:
                return None
            body = node.body if isinstance(node, ast.ClassDef) else []
        if isinstance(node, ast.ClassDef):
            return None
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        spans.append((start, node.end_lineno))
    lines = text.splitlines(keepends=True)
    for start, end in sorted(spans, reverse=True):
        del lines[start - 1 : end]
    try:
        pyast.parse("".join(lines))
    except SyntaxError:  # a class left without a body
        return None
    return "".join(lines)


def hidden_texts(
    repo: Repo, failing: list[str]
) -> tuple[dict[str, str], dict[str, list[str]]] | str:
    """The hidden test files (path -> text) for these failing tests, each without the tests
    that were skipped or deselected before mutation (the verifier counts a skipped hidden
    test as a forged verdict, and a deselected one fails with the reference fix too), and
    what was removed; or why there is none."""
    files = sorted({n.split("::")[0] for n in failing})
    failing_names = {(n.split("::")[0], _test_name(n)) for n in failing}
    texts, removed = {}, {}
    for rel in files:
        text = (repo.root / rel).read_text()
        cut = {_test_name(n): o for n, o in repo.tests.items()
               if o in ("skipped", "deselected") and n.split("::")[0] == rel}  # fmt: skip
        both = set(cut) & {name for f, name in failing_names if f == rel}
        if both:
            kind = "skips" if "skipped" in {cut[n] for n in both} else "deselected"
            return f"{kind}: a failing test has {cut[min(both)]} instances before mutation ({rel})"
        if cut:
            trimmed = trim_skipped(text, set(cut))
            if trimmed is None:
                return f"skips: {rel} has skipped or deselected tests that cannot be cut out of it"
            text, removed[rel] = trimmed, sorted("::".join(n) for n in cut)
        texts[rel] = text
    return texts, removed


HELD_OUT_EVERY = 3  # one test in this many (of a hidden file) leaves the workspace's copy


def held_out_texts(
    repo: Repo, failing: list[str], hidden: dict[str, str], seed: int
) -> tuple[dict[str, str], dict[str, list[str]]]:
    """The workspace's copy of each hidden test file, with part of its tests held out
    (issue 44: the hidden tests are not the visible ones), and the names held out. Every
    HELD_OUT_EVERY-th test of a file (from an offset hashed from the file and the seed) is
    cut, but never the file's first failing test: the agent still sees the bug fail. A file
    whose tests cannot be cut out of its source stays whole."""
    visible, held = {}, {}
    for rel, text in hidden.items():
        names = sorted({_test_name(n) for n in repo.tests if n.split("::")[0] == rel} - {()})
        shown = min((_test_name(n) for n in failing if n.split("::")[0] == rel), default=())
        offset = int(hashlib.sha256(f"{seed}\0{rel}".encode()).hexdigest()[:8], 16)
        cut = {name for i, name in enumerate(names)
               if (i + offset) % HELD_OUT_EVERY == 0 and name != shown}  # fmt: skip
        trimmed = trim_skipped(text, cut) if cut else None
        visible[rel] = trimmed if trimmed is not None else text
        if trimmed is not None:
            held[rel] = sorted("::".join(n) for n in cut)
    return visible, held


def family_split(family: str, config: MineConfig) -> str:
    if config.split != "auto":
        return config.split
    u = int(hashlib.sha256(f"{config.split_salt}:{family}".encode()).hexdigest()[:8], 16) / 2**32
    if u < config.test_fraction:
        return "test"
    return "val" if u < config.test_fraction + config.val_fraction else "train"


def _protected(repo: Repo) -> list[str]:
    """Every test file (or whole test folder) and every pytest configuration file."""
    out: set[str] = set()
    module_dirs = {os.path.dirname(m) for m in repo.modules}
    for t in repo.test_files:
        folder = os.path.dirname(t)
        out.add(f"{folder}/" if folder and folder not in module_dirs else t)
    for rel in walk_py(repo.root) + [p for p in os.listdir(repo.root)]:
        if os.path.basename(rel) in CONFIG_NAMES:
            out.add(rel)
    out.update(n for n in CONFIG_NAMES if (repo.root / n).exists())
    return sorted(out)


def _patch(rel: str, old: str, new: str) -> str:
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 f"a/{rel}", f"b/{rel}")  # fmt: skip
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in lines)  # fmt: skip


def _instruction(failing: list[str], command: list[str]) -> str:
    shown = ", ".join(failing[:5]) + (f" and {len(failing) - 5} more" if len(failing) > 5 else "")
    return (f"Tests of this repository fail: {shown}. Run `{' '.join(command)}` to see the "
            "failures, find the bug in the library's source code and fix it. Do not modify "
            "the tests or the test configuration.")  # fmt: skip


# long: one task folder, field by field (docs/tasks.md is the contract it follows)
def write_task(repo: Repo, cand: Candidate, buggy: str, failing: list[str], cases: dict,
               out: Path, config: MineConfig, upstream: dict) -> Task:  # fmt: skip
    original = (repo.root / cand.module).read_text()
    dotted = cand.module.removesuffix(".py").removeprefix("src/").replace("/", ".")
    family = f"{repo.name}/{dotted}"
    digest = hashlib.sha256(f"{family}\0{cand.name}\0{buggy}".encode()).hexdigest()[:10]
    task_id = f"mined-{re.sub(r'[^A-Za-z0-9_.-]', '-', repo.name)}-{digest}"
    folder = out / task_id
    if folder.exists():
        shutil.rmtree(folder)
    copy_repo(repo.root, folder / "repo")
    shutil.rmtree(folder / "repo" / TOOLS, ignore_errors=True)
    (folder / "repo" / cand.module).write_text(buggy)
    hidden, removed = hidden_texts(repo, failing)  # try_candidate checked it gives some
    hidden_files = sorted(hidden)
    for rel, text in hidden.items():
        dst = folder / "hidden_tests" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text)
    visible, held = held_out_texts(repo, failing, hidden, config.seed)
    for rel, text in visible.items():
        (folder / "repo" / rel).write_text(text)
    held_ids = {f"{rel}::{name}" for rel, names in held.items() for name in names}
    shown = [n for n in failing if n.split("[", 1)[0] not in held_ids]
    (folder / "reference.patch").write_text(_patch(cand.module, buggy, original))
    (folder / HIDDEN_CASES_FILE).write_text(json.dumps(cases, indent=1) + "\n")
    reqs: str | list[str] = list(repo.env.requirements)
    if reqs:
        (folder / "environment").mkdir()
        (folder / "environment" / "requirements.txt").write_text("\n".join(reqs) + "\n")
        reqs = "environment/requirements.txt"
    # The agent's view of the failure leaves out what was deselected before mutation.
    deselect = [f"--deselect={n}" for n in sorted(repo.deselected)
                if "::" in n and n.split("::")[0] in hidden]  # fmt: skip
    command = ["python", "-m", "pytest", "-q", "-o", "addopts=", *deselect, *hidden_files]
    meta = TaskMetadata(family=family, bug_class=cand.operator, split=family_split(family, config),
                        source="mined", extra={
        "repository": repo.name, "module": cand.module, "function": cand.function,
        "mutation": f"{cand.operator}#{cand.index} line {cand.lineno}",
        "failing_tests": failing, "hidden_tests_removed": removed,
        "hidden_tests_held_out": held,
        "n_hidden_cases": len(cases["cases"]),
        "src_layout": repo.src_layout, "upstream": upstream,
        "deselected_before_mutation": {n: r for n, r in repo.deselected.items()
                                       if n.split("::")[0] in hidden},
        "mine_seed": config.seed})  # fmt: skip
    limits = TaskLimits(memory_mb=config.memory_mb, per_test_timeout_s=config.per_test_timeout_s)
    task = Task(id=task_id, instruction=_instruction(shown, command), metadata=meta,
                root=folder.resolve(), test_command=tuple(command),
                protected_paths=tuple(_protected(repo)), has_reference=True,
                environment=replace(repo.env, requirements_file=reqs if isinstance(reqs, str) else ""),
                limits=limits)  # fmt: skip
    spec = task_spec(task)
    (folder / "task.json").write_text(json.dumps(spec, indent=2) + "\n")
    return load_task(folder)
