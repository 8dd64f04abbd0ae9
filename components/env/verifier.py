"""Verifier: run the hidden tests on the agent's changes in a fresh sandboxed copy.

The verification copy starts from the task's original repo, takes the agent's changes to
ordinary source files, and ignores changes to protected paths (tests) and to anything that
configures pytest or the interpreter (conftest.py, pytest.ini, sitecustomize.py, *.pth, ...):
those are reported as tampering, so editing a test can never make it pass. The hidden tests
are then overlaid and run with a per-test timeout. A pass needs exit code 0 *and* a JUnit
report with every hidden test present and none failed, errored or skipped, so code that
exits the interpreter early (`os._exit(0)` at import) does not pass.

A fault of the harness itself (the sandbox could not start, the whole run hit the
verifier's wall limit, pytest usage/internal errors) is an infrastructure failure, which
callers must keep out of rewards and statistics; it is never a test failure.
"""

from __future__ import annotations

import ast
import dataclasses
import filecmp
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from components.env.config import EnvConfig
from components.env.sandbox import SandboxConfig, run_sandboxed
from components.tasks.task import Task

IGNORED_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".git", ".mypy_cache"}
# Files that change how pytest or the interpreter behaves: never taken from the agent.
CONFIG_FILES = {
    "conftest.py",
    "pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "sitecustomize.py",
    "usercustomize.py",
}
LINT_RULES = "E,F,W"
SECURITY_RULES = "S"
# assert and pseudo-random numbers are normal in this code base; not security findings.
RUFF_IGNORE = "E501,S101,S311"


@dataclass
class Verification:
    status: str  # "ok" | "infra_error"
    tests_passed: bool = False
    tests_total: int = 0
    tests_failed: int = 0
    changed_files: list[str] = field(default_factory=list)
    tampered_files: list[str] = field(default_factory=list)
    lint_introduced: int = 0
    security_introduced: int = 0
    security_findings: list[str] = field(default_factory=list)
    # pytest reported a pass in-process but the out-of-process cases failed: the code under
    # test forged the verdict (or returns values that only compare equal, e.g. 3.0 for 3).
    forged_pass: bool = False
    detail: str = ""
    wall_s: float = 0.0


def _walk_files(root: Path) -> set[str]:
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in IGNORED_PARTS]
        for name in filenames:
            if name.endswith((".pyc", ".pyo")):
                continue
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def changed_files(original: Path, final: Path) -> list[str]:
    """Relative paths added, removed or modified between two repo trees."""
    a, b = _walk_files(original), _walk_files(final)
    changed = (a ^ b) | {
        p for p in a & b if not filecmp.cmp(original / p, final / p, shallow=False)
    }
    return sorted(changed)


def is_tampering(task: Task, rel_path: str) -> bool:
    name = os.path.basename(rel_path)
    return task.is_protected(rel_path) or name in CONFIG_FILES or name.endswith(".pth")


def count_hidden_tests(task: Task) -> int:
    """Test functions in the hidden files (module level and in Test* classes)."""
    n = 0
    for rel in task.hidden_test_files():
        if not rel.endswith(".py"):
            continue
        tree = ast.parse((task.hidden_tests_dir / rel).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                n += 1
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                n += sum(
                    isinstance(m, ast.FunctionDef) and m.name.startswith("test") for m in node.body
                )
    return n


def build_verification_tree(
    task: Task, final_repo: Path, dest: Path
) -> tuple[list[str], list[str]]:
    """Original repo + the agent's non-tampering changes + hidden tests, written to dest."""
    changed = changed_files(task.repo_dir, final_repo)
    tampered = [p for p in changed if is_tampering(task, p)]
    shutil.copytree(task.repo_dir, dest, symlinks=True, dirs_exist_ok=True)
    for rel in changed:
        if rel in tampered:
            continue
        src, dst = final_repo / rel, dest / rel
        if src.is_symlink() or not src.exists():
            # Deleted by the agent (a symlink is never followed into the verification copy).
            if dst.exists() or dst.is_symlink():
                dst.unlink()
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    for rel in task.hidden_test_files():
        dst = dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(task.hidden_tests_dir / rel, dst)
    return changed, tampered


def _ruff_counts(root: Path, files: list[str]) -> Counter:
    """Diagnostics per (file, rule code) for the given files under root."""
    present = [f for f in files if (root / f).is_file()]
    if not present:
        return Counter()
    ruff = Path(sys.executable).with_name("ruff")
    exe = str(ruff) if ruff.exists() else (shutil.which("ruff") or "ruff")
    proc = subprocess.run(
        [exe, "check", "--isolated", "--no-cache", "--output-format", "json", "--exit-zero",
         "--select", f"{LINT_RULES},{SECURITY_RULES}", "--ignore", RUFF_IGNORE, *present],
        cwd=root, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"ruff failed: {proc.stderr.strip()[:300]}")
    counts: Counter = Counter()
    for d in json.loads(proc.stdout or "[]"):
        counts[(os.path.relpath(d["filename"], root), d["code"])] += 1
    return counts


def introduced_findings(original: Path, final: Path, files: list[str]) -> dict[str, list[str]]:
    """Ruff findings in `files` that the final tree has more of than the original."""
    py = [f for f in files if f.endswith(".py")]
    before, after = _ruff_counts(original, py), _ruff_counts(final, py)
    out: dict[str, list[str]] = {"lint": [], "security": []}
    for (path, code), n in sorted(after.items()):
        extra = n - before.get((path, code), 0)
        if extra > 0:
            out["security" if code.startswith("S") else "lint"] += [f"{path}: {code}"] * extra
    return out


def _junit_summary(path: Path) -> tuple[int, int, int] | None:
    """(tests, failed-or-errored-or-skipped, skipped) from a JUnit XML report, None if
    unusable."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        return None
    total = sum(int(s.get("tests", 0)) for s in suites)
    bad = sum(int(s.get(k, 0)) for s in suites for k in ("failures", "errors", "skipped"))
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return total, bad, skipped


def verify(task: Task, final_repo: Path, env: EnvConfig, sandbox: SandboxConfig) -> Verification:
    """Hidden-test verdict plus the facts the reward terms need."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="agentrl-verify-") as tmp:
        tree = Path(tmp) / "repo"
        try:
            changed, tampered = build_verification_tree(task, final_repo, tree)
            kept = [p for p in changed if p not in tampered]
            findings = introduced_findings(task.repo_dir, tree, kept)
        except (OSError, RuntimeError, subprocess.SubprocessError, SyntaxError) as e:
            return Verification(
                status="infra_error", detail=f"could not build verification tree: {e}",
                wall_s=time.monotonic() - start,
            )  # fmt: skip
        result = Verification(
            status="ok",
            changed_files=changed,
            tampered_files=tampered,
            lint_introduced=len(findings["lint"]),
            security_introduced=len(findings["security"]),
            security_findings=findings["security"],
        )
        # A random report name: code under test cannot guess where to forge it.
        junit = f".junit-{secrets.token_hex(8)}.xml"
        if task.verify_command is not None:
            argv = list(task.verify_command)
        else:
            argv = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                    f"--timeout={env.per_test_timeout_s:g}",
                    f"--junitxml={junit}", *task.hidden_test_files()]  # fmt: skip
        cfg = dataclasses.replace(
            sandbox,
            wall_time_s=env.verify_timeout_s,
            cpu_time_s=max(sandbox.cpu_time_s, int(env.verify_timeout_s)),
        )
        try:
            cmd = run_sandboxed(argv, tree, cfg)
        except Exception as e:  # noqa: BLE001 - any harness crash is an infra fault
            result.status, result.detail = "infra_error", f"sandbox failed: {e!r}"
            result.wall_s = time.monotonic() - start
            return result
        result.detail = cmd.output[-2000:]
        if cmd.limit_hit == "wall_time":  # processes/memory limits are the code's fault
            result.status = "infra_error"
            result.detail = f"verifier timed out after {env.verify_timeout_s:g}s\n" + result.detail
        elif task.verify_command is not None:
            result.tests_passed = cmd.exit_code == 0
        elif cmd.exit_code in (3, 4):  # pytest internal/usage error: our harness, not the agent
            result.status = "infra_error"
            result.detail = f"pytest exit code {cmd.exit_code}\n" + result.detail
        else:
            summary = _junit_summary(tree / junit)
            expected = count_hidden_tests(task)
            if summary is not None:
                result.tests_total, result.tests_failed, _ = summary
            result.tests_passed = (
                cmd.exit_code == 0
                and summary is not None
                and summary[1] == 0
                and summary[0] >= max(expected, 1)
            )
            # Hidden tests never skip, and pytest never exits 0 without its report or with
            # tests missing: either means the code under test ended or bent the run.
            result.forged_pass = (cmd.exit_code == 0 and (
                summary is None or summary[0] < max(expected, 1))) or (
                summary is not None and summary[2] > 0)  # fmt: skip
        if result.status == "ok" and result.tests_passed and task.hidden_cases_path:
            cases_tree = Path(tmp) / "cases"
            shutil.copytree(tree, cases_tree, symlinks=True)
            for rel in task.hidden_test_files():
                (cases_tree / rel).unlink(missing_ok=True)
            status, n, bad, detail = check_hidden_cases(task, cases_tree, env, sandbox)
            result.tests_total += n
            result.tests_failed += bad
            result.detail += "\n" + detail
            if status != "ok":
                result.status = status
            result.forged_pass = status == "ok" and bad > 0
            result.tests_passed = bad == 0
        result.wall_s = time.monotonic() - start
        return result


# Runs inside the sandbox with only the *arguments* of the hidden cases; prints plain-value
# reprs of the results. The expected values stay in the verifier process, so code under
# test can neither read them nor forge a pass (patching pytest, rewriting the JUnit file,
# returning an object whose __eq__ is always true).
CASE_RUNNER = r"""
import ast, importlib.util, json, signal, sys

PLAIN = (int, float, complex, str, bytes, bool, type(None))


def check(x, depth=0):
    if depth > 64:
        raise TypeError("result nested too deeply")
    t = type(x)  # exact types only: a subclass could fake its repr or equality
    if t in PLAIN:
        return
    if t in (list, tuple, set, frozenset):
        for y in x:
            check(y, depth + 1)
        return
    if t is dict:
        for k, v in x.items():
            check(k, depth + 1)
            check(v, depth + 1)
        return
    raise TypeError("result of type %s is not a plain value" % t.__name__)


def on_alarm(signum, frame):
    raise TimeoutError("case timed out")


def main():
    args_path, module_file, function, timeout = sys.argv[1:5]
    with open(args_path) as f:
        all_args = json.load(f)
    sys.path.insert(0, ".")
    spec = importlib.util.spec_from_file_location("module_under_test", module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, function)
    signal.signal(signal.SIGALRM, on_alarm)
    out = []
    for text in all_args:
        try:
            args = ast.literal_eval(text)
            signal.setitimer(signal.ITIMER_REAL, float(timeout))
            try:
                value = fn(*args)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            check(value)
            out.append({"repr": repr(value)})
        except BaseException as e:
            out.append({"error": type(e).__name__})
    sys.stdout.write("\nAGENTRL-CASES " + json.dumps(out) + "\n")
    sys.stdout.flush()


main()
"""
CASES_MARKER = "AGENTRL-CASES "


def same_value(a: object, b: object) -> bool:
    """Equality with exact types, recursively (3 != 3.0 != True here, unlike ==)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


def check_hidden_cases(
    task: Task, tree: Path, env: EnvConfig, sandbox: SandboxConfig
) -> tuple[str, int, int, str]:
    """(status, cases, failed, detail) of the hidden cases run out of reach of the code.

    `tree` must not contain the hidden tests (they hold the expected values)."""
    spec = json.loads(task.hidden_cases_path.read_text())
    cases = spec["cases"]
    token = secrets.token_hex(6)
    runner, args_file = f".agentrl_runner_{token}.py", f".agentrl_args_{token}.json"
    (tree / runner).write_text(CASE_RUNNER)
    (tree / args_file).write_text(json.dumps([c["args"] for c in cases]))
    cfg = dataclasses.replace(
        sandbox,
        wall_time_s=env.verify_timeout_s,
        cpu_time_s=max(sandbox.cpu_time_s, int(env.verify_timeout_s)),
        max_output_bytes=max(sandbox.max_output_bytes, 1 << 20),
    )
    argv = ["python", runner, args_file, spec["module"], spec["function"],
            f"{env.per_test_timeout_s:g}"]  # fmt: skip
    cmd = run_sandboxed(argv, tree, cfg)
    if cmd.limit_hit == "wall_time":
        return "infra_error", len(cases), len(cases), "hidden cases timed out"
    marker = cmd.output.rfind(CASES_MARKER)
    if marker < 0:
        return "ok", len(cases), len(cases), "module under test gave no case results"
    try:
        got = json.loads(cmd.output[marker + len(CASES_MARKER) :].splitlines()[0])
    except (json.JSONDecodeError, IndexError):
        return "ok", len(cases), len(cases), "unreadable case results"
    failed = 0
    for case, result in zip(cases, got + [{}] * (len(cases) - len(got)), strict=False):
        try:
            ok = "repr" in result and same_value(
                ast.literal_eval(result["repr"]), ast.literal_eval(case["expected"])
            )
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            ok = False
        failed += not ok
    return "ok", len(cases), failed, f"{len(cases) - failed}/{len(cases)} hidden cases match"


class VerifierInfraError(RuntimeError):
    """The harness failed; the task's verdict is unknown (not a test failure)."""


def sandboxed_test_runner(env: EnvConfig | None = None, sandbox: SandboxConfig | None = None):
    """`run_tests(task, repo_dir) -> (passed, detail)` for the task gate, via `verify`."""
    env, sandbox = env or EnvConfig(), sandbox or SandboxConfig()

    def run_tests(task: Task, repo_dir: Path) -> tuple[bool, str]:
        v = verify(task, Path(repo_dir), env, sandbox)
        if v.status != "ok":
            raise VerifierInfraError(f"{task.id}: {v.detail.strip()[:300]}")
        return v.tests_passed, f"{v.tests_total - v.tests_failed}/{v.tests_total} hidden tests pass"

    return run_tests
