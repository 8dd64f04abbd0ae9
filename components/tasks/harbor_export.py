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
from pathlib import Path

from components import shutdown
from components.tasks.harbor import (
    CASE_CHILD,
    CASES_FILE,
    CASES_RUNNER,
    HARBOR_TESTS,
    SCHEMA_VERSION,
    SET_ASIDE,
    is_harbor_task,
    task_env,
    task_workdir,
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


def fixed_files(task: Task, patch: str) -> tuple[dict[str, bytes], list[str]]:
    """({path: bytes} the reference fix writes, [paths it deletes]) under repo/."""
    from components.tasks.patching import apply_unified_diff

    with shutdown.temporary_folder("agentrl-harbor-export-") as tmp:
        fixed = Path(tmp) / "repo"
        shutil.copytree(task.repo_dir, fixed, symlinks=True)
        changed = apply_unified_diff(fixed, patch)
        written = {rel: (fixed / rel).read_bytes() for rel in changed if (fixed / rel).is_file()}
    return written, [rel for rel in changed if rel not in written]


def _write_solution(out: Path, task: Task, patch: str) -> None:
    """solution/: the fixed files themselves and a solve.sh that copies them over WORKDIR
    (and removes what the fix deletes). No `patch` or `git`: python:X-slim images ship
    neither; `cp`/`rm` are in every image. reference.patch rides along for readers."""
    written, deleted = fixed_files(task, patch)
    (out / "solution" / "files").mkdir(parents=True)
    (out / "solution" / "reference.patch").write_text(patch)
    for rel, data in written.items():
        (out / "solution" / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / "solution" / "files" / rel).write_bytes(data)
    workdir = task_workdir(task)
    lines = ["#!/bin/bash", "# Written by agentrl: the reference fix (solution/files/ over "
             f"{workdir}; reference.patch is the same fix as a diff).", "set -e",
             f"cp -r /solution/files/. {workdir}/"]  # fmt: skip
    lines += [f"rm -f {shlex.quote(f'{workdir}/{rel}')}" for rel in deleted]
    (out / "solution" / "solve.sh").write_text("\n".join(lines) + "\n")


def _dockerfile(task: Task) -> str:
    """environment/Dockerfile: the task's Python, its pins (the harness's once: pytest and
    pytest-timeout at the project's versions, a requirement naming them left out; a task
    imported from Harbor: its own pins as imported, whose test.sh needs no pytest-timeout,
    so that importing the export gives the same environment), its ENV and WORKDIR, the repo
    copied there."""
    from importlib.metadata import version

    from components.tasks.environments import HARNESS_DISTRIBUTIONS, _requirement_name

    env = task.environment
    python = env.python if env is not None else f"{sys.version_info[0]}.{sys.version_info[1]}"
    own = [r for r in (env.requirements if env is not None else ())
           if _requirement_name(r) not in HARNESS_DISTRIBUTIONS]  # fmt: skip
    pins = [f"pytest=={version('pytest')}", f"pytest-timeout=={version('pytest-timeout')}", *own]
    if is_harbor_task(task):  # the project's interpreter with the harness only: pytest
        pins = list(dict.fromkeys(env.requirements)) if env is not None else pins[:1]
    workdir = task_workdir(task)
    lines = [f"FROM python:{python}-slim", ""]
    lines += [f"RUN pip install --no-cache-dir {' '.join(pins)}"] if pins else []
    lines += [f"ENV {k}={shlex.quote(v)}" for k, v in task_env(task).items()]
    lines += ["", f"WORKDIR {workdir}", "", f"COPY app/ {workdir}/"]
    return "\n".join(lines) + "\n"


def _write_tests(out: Path, task: Task) -> None:
    """tests/: a Harbor task's own tests as they were imported (its test.sh runs them);
    else the hidden tests under tests/hidden/ with our test.sh (and the hidden cases)."""
    if is_harbor_task(task):
        shutil.copytree(task.hidden_tests_dir / HARBOR_TESTS, out / "tests")
        if task.hidden_cases_path is not None:  # test.sh runs them (an export of ours)
            shutil.copy(task.hidden_cases_path, out / "tests" / CASES_FILE)
        return
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


def export_harbor_task(task: Task, dest: Path) -> Path:
    """Write `task` as a Harbor task folder dest/<id>/; returns it. Its hidden cases
    (hidden_cases.json: mined and imported tasks) go to tests/ with tests/run_cases.py,
    which test.sh runs after the hidden tests; the import of the export takes them back.
    A task imported from Harbor goes back as it came: its own tests and test.sh, its
    task.toml (metadata, resources, timeouts), its ENV and WORKDIR."""
    out = dest / task.id
    (out / "environment").mkdir(parents=True)
    shutil.copytree(task.repo_dir, out / "environment" / "app", symlinks=True)
    (out / "environment" / "Dockerfile").write_text(_dockerfile(task))
    _write_tests(out, task)
    (out / "instruction.md").write_text(task.instruction)
    patch = task.reference_patch()
    if patch is not None:
        _write_solution(out, task, patch)
    (out / "task.toml").write_text(toml_text(_task_toml(task)))
    return out


def _task_toml(task: Task) -> dict:
    """task.toml: the imported one (a Harbor task's) with our metadata and limits over it."""
    m = task.metadata
    harbor = m.extra.get("harbor") if isinstance(m.extra.get("harbor"), dict) else {}
    doc = json.loads(json.dumps(harbor.get("task_toml") or {}, default=str))
    doc.setdefault("schema_version", SCHEMA_VERSION)
    meta = doc.setdefault("metadata", {})
    meta.update({"agentrl_id": task.id, "category": m.family, "bug_class": m.bug_class,
                 "split": m.split, "source": m.source})  # fmt: skip
    if harbor.get("original_id"):
        meta["original_id"] = harbor["original_id"]
    for phase, timeout in (("verifier", 600.0), ("agent", 1800.0), ("environment", None)):
        section = doc.setdefault(phase, {})
        section.setdefault("network_mode", "no-network")
        if timeout is not None:
            section.setdefault("timeout_sec", timeout)
    doc["environment"].setdefault("build_timeout_sec", 600.0)
    if task.limits is not None and task.limits.memory_mb:
        doc["environment"]["memory_mb"] = task.limits.memory_mb
    if task.limits is not None and task.limits.per_test_timeout_s:
        meta["agentrl_per_test_timeout_s"] = task.limits.per_test_timeout_s
    return doc


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # inside an array: an inline table
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(str(v))  # a JSON string is a TOML basic string


def toml_text(doc: dict, table: str = "") -> str:
    """The TOML of `doc` (strings, numbers, booleans, arrays, nested tables), keys quoted."""
    lines = [
        f"{json.dumps(k)} = {_toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)
    ]
    text = "\n".join(lines) + ("\n" if lines else "")
    for k, v in ((k, v) for k, v in doc.items() if isinstance(v, dict)):
        name = f"{table}.{json.dumps(k)}" if table else json.dumps(k)
        text += f"\n[{name}]\n" + toml_text(v, name)
    return text
