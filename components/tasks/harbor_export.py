"""Harbor tasks out: one of our tasks written as a Harbor task (docs/tasks.md).

Export (`export_harbor_task`) writes one of our tasks as a Harbor task that harbor's own
TaskConfig model loads: the repo as the image's /app, the hidden tests under tests/ with a
test.sh that runs them and writes the reward; the hidden cases (hidden_cases.json) in
tests/ with tests/run_cases.py, which test.sh runs too (import takes them back); the
reference fix as solution/files/ and a solve.sh that copies them (python:X-slim images
have no `patch` or `git`).

What the exported test.sh protects (issue 44): no code under test runs while the hidden
cases' expected values are in a file (test.sh reads them into its own shell and removes the
file first, then puts it back at the end; the case child gets the arguments only); pytest
starts with a safe path (`python -P`, /app appended after pytest and its plugins, so an
/app/pytest_timeout.py replaces nothing); a reward file already there when the tests and
cases are done is not test.sh's: it is set aside (SET_ASIDE) and the reward is 0. Not
protected, as in any Harbor task: a process the agent left running in the container, or
code under test that reads test.sh's memory (where ptrace rules allow it).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

from components.tasks.harbor import (
    CASE_CHILD,
    CASES_FILE,
    CASES_RUNNER,
    SCHEMA_VERSION,
    SET_ASIDE,
    WORKDIR,
)
from components.tasks.task import (
    Task,
)

_TEST_SH = """#!/bin/bash
# Written by agentrl: put the hidden tests over the agent's /app, run them and the hidden
# cases, write the reward. The cases' expected values are read into this shell and their
# file removed before any code under test runs (put back at the end); the interpreter
# starts with a safe path (python -P: /app comes after pytest and its plugins).
CASES=""
if [ -f /tests/{cases_file} ]; then
  CASES="$(cat /tests/{cases_file}; echo x)"
  CASES="${{CASES%x}}"
  rm -f /tests/{cases_file}
fi
cp -r /tests/hidden/. /app/
cd /app
ok=1
{command} || ok=0
{cases}# A reward file there now is not this script's: set aside (the verifier reads that as a
# forged verdict), reward 0.
for f in reward.txt reward.json rewards.json; do
  if [ -e "/logs/verifier/$f" ] || [ -L "/logs/verifier/$f" ]; then
    echo "/logs/verifier/$f was there before test.sh wrote its reward: set aside, reward 0"
    ok=0
    rm -rf "/logs/verifier/{set_aside}$f"
    mv "/logs/verifier/$f" "/logs/verifier/{set_aside}$f"
  fi
done
echo $ok > /logs/verifier/reward.txt
if [ -n "$CASES" ]; then
  printf '%s' "$CASES" > /tests/{cases_file}
fi
"""
_CASES_LINE = "printf '%s' \"$CASES\" | python /tests/{runner} || ok=0\n"
# pytest with the harness first: /app after it on sys.path, and pytest-timeout (and any
# plugin PYTEST_PLUGINS names) imported before pytest reads the task's `pythonpath`, which
# puts /app ahead of everything before it loads plugins (what `python -m pytest` in /app
# does too).
_PYTEST = (
    "import os, sys; sys.path.append('/app'); import pytest, pytest_timeout; "
    "[__import__(m) for m in os.environ.get('PYTEST_PLUGINS', '').split(',') if m]; "
    "sys.exit(pytest.main(sys.argv[1:]))"
)


# tests/run_cases.py of an exported task with hidden cases: the verifier's hidden-case
# check (components/verifier/hidden_cases.py) without agentrl. The cases come on stdin
# (test.sh holds them; their file is gone while code under test runs). Each case is called
# in a child process (harbor.py's CASE_CHILD) that is given only the arguments; the expected
# values stay in this process and are compared here with exact types (3 != 3.0 != True), so
# an object whose __eq__ always says yes, or code that patches pytest, does not pass a case.
_RUN_CASES = (
    "# Written by agentrl: the task's hidden cases (hidden_cases.json, on stdin from test.sh).\n"
    "import ast, json, os, subprocess, sys\n\n"
    f"CHILD = {CASE_CHILD!r}\n"
    + r"""

def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def main():
    try:
        spec = json.loads(sys.stdin.read())
    except ValueError:
        print("hidden cases: none given (test.sh found no hidden_cases.json)")
        sys.exit(1)
    token = "AGENTRL-CASES-" + os.urandom(8).hex()
    calls = [c["args"] for c in spec["cases"]]
    try:
        run = subprocess.run([sys.executable, "-P", "-c", CHILD, token, spec["module"],
                              spec["function"]], input=json.dumps(calls), capture_output=True,
                             text=True, timeout=60 + 11 * len(calls))
        lines = [ln for ln in run.stdout.splitlines() if ln.startswith(token + " ")]
        results = json.loads(lines[-1][len(token) + 1:]) if lines else []
    except (subprocess.TimeoutExpired, ValueError):
        results = []
    failed = 0
    for n, case in enumerate(spec["cases"]):
        got = results[n] if n < len(results) else {"error": "no result"}
        try:
            ok = "repr" in got and same(ast.literal_eval(got["repr"]),
                                        ast.literal_eval(case["expected"]))
        except Exception:
            ok = False
        if not ok:
            failed += 1
            print(("hidden case %d: %s%s: expected %s, got %s" % (
                n + 1, spec["function"], case["args"], case["expected"],
                got.get("repr", got.get("error"))))[:300])
    print("hidden cases: %d of %d passed" % (len(spec["cases"]) - failed, len(spec["cases"])))
    sys.exit(1 if failed or not spec["cases"] else 0)


main()
"""
)


def _fixed_files(task: Task, patch: str) -> tuple[dict[str, bytes], list[str]]:
    """({path: bytes} the reference fix writes, [paths it deletes]) under repo/."""
    from components.tasks.patching import apply_unified_diff

    with tempfile.TemporaryDirectory(prefix="agentrl-harbor-export-") as tmp:
        fixed = Path(tmp) / "repo"
        shutil.copytree(task.repo_dir, fixed, symlinks=True)
        changed = apply_unified_diff(fixed, patch)
        written = {rel: (fixed / rel).read_bytes() for rel in changed if (fixed / rel).is_file()}
    return written, [rel for rel in changed if rel not in written]


def _write_solution(out: Path, task: Task, patch: str) -> None:
    """solution/: the fixed files themselves and a solve.sh that copies them over /app
    (and removes what the fix deletes). No `patch` or `git`: python:X-slim images ship
    neither; `cp`/`rm` are in every image. reference.patch rides along for readers."""
    written, deleted = _fixed_files(task, patch)
    (out / "solution" / "files").mkdir(parents=True)
    (out / "solution" / "reference.patch").write_text(patch)
    for rel, data in written.items():
        (out / "solution" / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / "solution" / "files" / rel).write_bytes(data)
    lines = ["#!/bin/bash", "# Written by agentrl: the reference fix (solution/files/ over "
             f"{WORKDIR}; reference.patch is the same fix as a diff).", "set -e",
             f"cp -r /solution/files/. {WORKDIR}/"]  # fmt: skip
    lines += [f"rm -f {shlex.quote(f'{WORKDIR}/{rel}')}" for rel in deleted]
    (out / "solution" / "solve.sh").write_text("\n".join(lines) + "\n")


def export_harbor_task(task: Task, dest: Path) -> Path:
    """Write `task` as a Harbor task folder dest/<id>/; returns it. Its hidden cases
    (hidden_cases.json: mined and imported tasks) go to tests/ with tests/run_cases.py,
    which test.sh runs after the hidden tests; the import of the export takes them back."""
    from importlib.metadata import version

    out = dest / task.id
    (out / "environment").mkdir(parents=True)
    shutil.copytree(task.repo_dir, out / "environment" / "app", symlinks=True)
    env = task.environment
    python = env.python if env is not None else f"{sys.version_info[0]}.{sys.version_info[1]}"
    pins = [f"pytest=={version('pytest')}", f"pytest-timeout=={version('pytest-timeout')}",
            *(env.requirements if env is not None else ())]  # fmt: skip
    (out / "environment" / "Dockerfile").write_text(
        f"FROM python:{python}-slim\n\nRUN pip install --no-cache-dir {' '.join(pins)}\n\n"
        f"WORKDIR {WORKDIR}\n\nCOPY app/ {WORKDIR}/\n"
    )
    shutil.copytree(task.hidden_tests_dir, out / "tests" / "hidden")
    if task.verify_command is not None:
        command = shlex.join(task.verify_command)
    else:
        command = shlex.join(["python", "-P", "-c", _PYTEST, "-q", "-p", "no:cacheprovider",
                              *task.hidden_test_files()])  # fmt: skip
    cases = ""
    if task.hidden_cases_path is not None:
        shutil.copy(task.hidden_cases_path, out / "tests" / CASES_FILE)
        (out / "tests" / CASES_RUNNER).write_text(_RUN_CASES)
        cases = _CASES_LINE.format(runner=CASES_RUNNER)
    (out / "tests" / "test.sh").write_text(
        _TEST_SH.format(command=command, cases=cases, cases_file=CASES_FILE, set_aside=SET_ASIDE)
    )
    (out / "instruction.md").write_text(task.instruction)
    patch = task.reference_patch()
    if patch is not None:
        _write_solution(out, task, patch)
    m = task.metadata
    (out / "task.toml").write_text(_toml({
        "schema_version": SCHEMA_VERSION,
        "metadata": {"agentrl_id": task.id, "category": m.family, "bug_class": m.bug_class,
                     "split": m.split, "source": m.source},
        "verifier": {"timeout_sec": 600.0, "network_mode": "no-network"},
        "agent": {"timeout_sec": 1800.0, "network_mode": "no-network"},
        "environment": {"build_timeout_sec": 600.0, "network_mode": "no-network"},
    }))  # fmt: skip
    return out


def _toml(doc: dict) -> str:
    """The small TOML export needs (strings, floats, one level of tables)."""

    def value(v) -> str:
        return json.dumps(v) if isinstance(v, str) else repr(v)

    lines = [f"{k} = {value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for table, items in ((k, v) for k, v in doc.items() if isinstance(v, dict)):
        lines += ["", f"[{table}]", *(f"{k} = {value(v)}" for k, v in items.items())]
    return "\n".join(lines) + "\n"
