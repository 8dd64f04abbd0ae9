"""Execute one agent tool call in a workspace: validate, check safety, run, observe.

`execute_tool` never raises for anything the agent can do wrong (bad arguments, unknown
paths, a blocked command, a patch that does not apply): it returns a `ToolResult` whose
observation says what happened, in words a model can act on. Every observation is capped
at `config.max_output_bytes` (head and tail kept, with a visible truncation line).

`ok` is False when the call failed (invalid arguments, blocked, a file/patch error, a
command that could not start or hit a sandbox limit); a command that ran and exited
non-zero (failing tests) is ok=True: that outcome is information, not a tool failure.
So is the task's own test command running out of time (`runs_task_tests`): real bugs loop,
and running the tests as instructed is what an honest agent does first, so the observation
says "tests timed out after N s" and `tests_timed_out` is set instead of a limit error; a
limit hit by any other program (the agent's own script, a loop it runs) stays a failure.

The tools run in the trainer's process, so their arguments and the tree cannot be allowed
to stall it: no tool opens a FIFO, socket or device (opened without blocking and checked
with fstat), `search` matches with RE2 (time linear in the text: no catastrophic
backtracking; no backreferences or lookaround), `apply_patch` refuses a file over
_PATCH_MAX_FILE_BYTES or a hunk search over _PATCH_MAX_COMPARISONS line comparisons, and a
symlink loop, a binary file or text no file name can hold is a failed call.

Besides the monitor's verdict on what a call says, a command is judged by what the sandbox
saw it do (`observed_verdict`): packets or connections in its empty network namespace, a
write the read-only host refused, a symlink out of the workspace. The same effect gets the
same category (and so the same penalty) whichever program or spelling produced it.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import io
import os
import posixpath
import re
import shlex
import stat
from dataclasses import dataclass
from pathlib import Path

from components.env.safety import SEVERITY, SafetyVerdict, classify_action
from components.env.tool_specs import argument_errors
from components.sandbox.config import SandboxConfig, SandboxError
from components.sandbox.output import cap_text
from components.sandbox.process import CommandResult, kernel_call_refused, run_sandboxed
from components.sandbox.workspace import (
    IGNORED_NAMES,
    NotRegularFileError,
    PathEscapeError,
    Workspace,
    read_regular,
)

# Room kept after a command's (already capped) output for the status lines.
_STATUS_RESERVE = 160
_MAX_LINE_CHARS = 2000  # longer lines are cut in read_file/search (minified files)
_SEARCH_MAX_FILE_BYTES = 2 * 1024 * 1024
# apply_patch's limits: the largest file it patches, and the most line comparisons its
# hunk search may need (file lines x hunk lines, summed): about a second at worst.
_PATCH_MAX_FILE_BYTES = 4 * 1024 * 1024
_PATCH_MAX_COMPARISONS = 2_000_000
_SKIP_DIRS = IGNORED_NAMES | {".git", ".hg", ".svn", ".venv", "node_modules"}
# What Python, coreutils and others print when the read-only host refuses a write (EROFS).
_READ_ONLY = re.compile(r"Read-only file system|\[Errno 30\]")


@dataclass(frozen=True)
class ToolResult:
    observation: str
    ok: bool
    truncated: bool
    error: str | None  # short machine-readable reason when ok is False
    safety: SafetyVerdict | None  # the monitor's verdict (None when not consulted)
    command: CommandResult | None  # set when run_command actually ran a program
    # The task's own test command ran out of time: an observation, not a violation.
    tests_timed_out: bool = False
    # The call ran the tests (a pytest command that started, or a tool that runs the task's
    # tests): what the tests_never_run reward term reads.
    ran_tests: bool = False


def execute_tool(
    workspace: Workspace,
    tool: str,
    arguments: dict,
    config: SandboxConfig,
    *,
    protected_paths: tuple[str, ...] = ("tests/",),
    test_command: tuple[str, ...] = (),
) -> ToolResult:
    """Run one tool call; see the module docstring for the result's meaning.
    `test_command`: the task's test command, whose timeouts are observations."""
    errors = argument_errors(tool, arguments)
    if errors:
        return failed_result(config, "invalid arguments: " + "; ".join(errors), "invalid arguments")
    verdict = classify_action(
        tool,
        arguments,
        protected_paths=protected_paths,
        allowed_programs=config.allowed_programs,
    )
    if not verdict.allowed:
        text = f"blocked by safety monitor: {verdict.category}: {verdict.reason}"
        return failed_result(config, text, f"blocked: {verdict.category}", safety=verdict)
    handler = _HANDLERS[tool]
    if tool == "run_command":
        handler = functools.partial(_run_command, test_command=tuple(test_command))
    try:
        result = handler(workspace, arguments, config)
    except PathEscapeError as e:
        result = failed_result(config, f"error: {e}", "path escape")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
        result = failed_result(
            config, f"error: {e.strerror or e}: {e.filename or ''}", "no such file"
        )
    except NotRegularFileError as e:
        result = failed_result(config, f"error: {e.filename} is not a regular file (a FIFO, "
                               "socket or device); not opened", "not a regular file")  # fmt: skip
    except OSError as e:  # e.g. permission denied, file too large to write
        result = failed_result(config, f"error: {e}", "os error")
    except (ValueError, RuntimeError) as e:  # text no file can hold, a link loop
        result = failed_result(config, f"error: {type(e).__name__}: {e}", "bad input")
    # An observed violation (set by the handler) outranks the monitor's "allowed".
    return dataclasses.replace(result, safety=result.safety or verdict)


def observed_verdict(ws: Workspace, cmd: CommandResult) -> SafetyVerdict | None:
    """A violation the sandbox saw a command commit (None: nothing seen)."""
    hits = []
    if cmd.network_attempts:
        hits.append(("network", f"observed: {cmd.network_attempts} packets or connection "
                     "attempts inside the sandbox's empty network namespace"))  # fmt: skip
    if _READ_ONLY.search(cmd.output):
        hits.append(("write_outside_workspace", "observed: a write was refused by the "
                     "read-only host"))  # fmt: skip
    if kernel_call_refused(cmd):
        hits.append(("write_outside_workspace", "observed: a kernel keyring call (a channel "
                     "out of the sandbox) was refused; the process was killed"))  # fmt: skip
    for rel in ws.new_escaping_links():
        hits.append(("path_escape", f"observed: symlink {rel} points outside the workspace"))
    if not hits:
        return None
    category, reason = min(hits, key=lambda h: SEVERITY.index(h[0]))
    return SafetyVerdict(False, category, reason)


def _result(
    config: SandboxConfig,
    text: str,
    *,
    ok: bool = True,
    error: str | None = None,
    command: CommandResult | None = None,
    truncated: bool = False,
) -> ToolResult:
    capped, cut = cap_text(text, config.max_output_bytes)
    return ToolResult(capped, ok, truncated or cut, error, None, command)


def failed_result(
    config: SandboxConfig, text: str, error: str, *, safety: SafetyVerdict | None = None
) -> ToolResult:
    capped, cut = cap_text(text, config.max_output_bytes)
    return ToolResult(capped, False, cut, error, safety, None)


# ----------------------------------------------------------------------------- run_command

# pytest's closing counts end with how long the run took ("2 failed, 1 passed in 0.31s",
# "(0:01:02)"): load-dependent text that would make two runs of the same episode differ
# (and the SFT data, and its version) while telling the agent nothing it can act on.
_DURATION = re.compile(
    r"(\b(?:passed|failed|errors?|skipped|xfailed|xpassed|deselected|warnings?|rerun"
    r"|no tests ran)) in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?"
)


def without_durations(output: str) -> str:
    """`output` with the run time taken off pytest's summary lines."""
    return _DURATION.sub(r"\1", output)


# A failure's section in pytest's report: from its "____ test_x ____" header to the next
# header or "=====" line.
_SECTION = re.compile(r"^_{3,} [^\n]+ _{3,}$\n(.*?)(?=^_{3,} [^\n]+ _{3,}$|^=+ |\Z)", re.M | re.S)
_TIMEOUT = re.compile(r"^E\s+Failed: Timeout.*$", re.M)


def without_timeout_frames(output: str) -> str:
    """`output` with the traceback of every test pytest-timeout stopped cut to its
    "Failed: Timeout" line: where a looping test was interrupted depends on the machine's
    speed and load, so the frames would make the same episode read (and rank its
    candidate fixes, components/env/fixes.py) differently from run to run."""

    def cut(m: re.Match) -> str:
        stopped = _TIMEOUT.search(m.group(1))
        if stopped is None:
            return m.group(0)
        return m.group(0)[: m.start(1) - m.start(0)] + stopped.group(0) + "\n\n"

    return _SECTION.sub(cut, output)


# How pytest is started: `python -m pytest` and `pytest` are the same program here.
_PYTEST_STARTS = (("python", "-m", "pytest"), ("python3", "-m", "pytest"), ("pytest",))
# pytest options that change what it shows or how soon it stops, never which code runs.
_VIEW_OPTION = re.compile(
    r"-[qvxsl]+|-r\w*|--tb=\w+|--timeout=\d+(?:\.\d+)?|--(?:exitfirst|verbose|quiet|no-header)"
)
_TIME_LIMITS = ("wall_time", "cpu_time")


def _pytest_args(argv: list[str] | tuple[str, ...]) -> list[str] | None:
    for start in _PYTEST_STARTS:
        if tuple(argv[: len(start)]) == start:
            return list(argv[len(start) :])
    return None


def runs_task_tests(argv: list[str] | tuple[str, ...], test_command: tuple[str, ...]) -> bool:
    """Whether `argv` runs the task's own tests: the task's test command itself or, for a
    pytest command, the same tests narrowed (a file or test id under the command's test
    paths) or shown differently (-q, -v, -x, --tb=..., --timeout=N, what the fix tools add).
    Anything else (the agent's own script, pytest on a file of its own, a plugin it loads)
    is the agent's program."""
    if not test_command:
        return False
    if list(argv) == list(test_command):
        return True
    mine, task = _pytest_args(argv), _pytest_args(test_command)
    if mine is None or task is None:
        return False
    roots = [posixpath.normpath(a) for a in task if not a.startswith("-")]
    for arg in mine:
        if _VIEW_OPTION.fullmatch(arg):
            continue
        path = posixpath.normpath(arg.split("::", 1)[0])
        if arg.startswith("-") or path.startswith(("/", "..")):
            return False
        if not any(root == "." or path == root or path.startswith(root + "/") for root in roots):
            return False
    return True


def _run_command(
    ws: Workspace, args: dict, config: SandboxConfig, *, test_command: tuple[str, ...] = ()
) -> ToolResult:
    try:
        argv = shlex.split(args["cmd"])
    except ValueError as e:
        return failed_result(config, f"error: cannot parse command: {e}", "bad command")
    if not argv:
        return failed_result(config, "error: empty command", "bad command")
    budget = max(256, config.max_output_bytes - _STATUS_RESERVE)
    run_config = dataclasses.replace(config, max_output_bytes=budget)
    try:
        cmd = run_sandboxed(argv, ws.root, run_config, workspace=ws.root)
    except SandboxError as e:
        return failed_result(config, f"error: {e}", "refused")
    # Every reader of the output (the observation, list_fixes / try_fix summaries, the
    # monitor) sees it without run times or where a timeout happened to interrupt a test.
    cmd = dataclasses.replace(cmd, output=without_timeout_frames(without_durations(cmd.output)))
    status = []
    tests_timed_out = cmd.limit_hit in _TIME_LIMITS and runs_task_tests(argv, test_command)
    if tests_timed_out:
        spent = (f"{config.wall_time_s:g} s" if cmd.limit_hit == "wall_time"
                 else f"{config.cpu_time_s} s of CPU time")  # fmt: skip
        status.append(f"[tests timed out after {spent}]")
    elif cmd.limit_hit == "wall_time":
        status.append(f"[killed: wall time limit of {config.wall_time_s:g}s exceeded]")
    elif cmd.limit_hit == "cpu_time":
        status.append(f"[killed: CPU time limit of {config.cpu_time_s}s exceeded]")
    elif cmd.limit_hit == "memory":
        status.append(f"[memory limit of {config.memory_mb} MiB exceeded]")
    elif cmd.limit_hit == "processes":
        status.append(f"[process limit of {config.max_processes} reached]")
    status.append(f"exit code {cmd.exit_code}")
    out = cmd.output
    text = out + ("" if not out or out.endswith("\n") else "\n") + "\n".join(status)
    failed = cmd.limit_hit not in (None, "output") and not tests_timed_out
    result = _result(
        config,
        text,
        ok=not failed,
        error=f"{cmd.limit_hit} limit hit" if failed else None,
        command=cmd,
        truncated=cmd.truncated,
    )
    return dataclasses.replace(
        result, safety=observed_verdict(ws, cmd), tests_timed_out=tests_timed_out,
        ran_tests="pytest" in args["cmd"],
    )  # fmt: skip


# ----------------------------------------------------------------------------- search


def _search(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    # RE2 matches in time linear in the text (no backtracking): a pattern like ^(a+)+$
    # cannot stall the trainer. It has no backreferences or lookaround.
    import re2

    try:
        regex = re2.compile(args["pattern"])
    except re2.error as e:
        return failed_result(
            config, f"error: invalid regular expression {args['pattern']!r}: {e} (RE2 "
            "syntax: no backreferences or lookaround)", "bad regex",
        )  # fmt: skip
    rel = args.get("path", ".")
    base = ws.resolve(rel)
    if not base.exists():
        return failed_result(config, f"error: no such file or folder: {rel}", "no such file")
    budget = config.max_output_bytes
    lines: list[str] = []
    size = matches = omitted = 0
    for path in _walk_files(ws, base):
        for lineno, text in _text_lines(path):
            if not regex.search(text):
                continue
            matches += 1
            line = f"{path.relative_to(ws.root)}:{lineno}: {text}"
            if size + len(line) + 1 <= budget:
                lines.append(line)
                size += len(line) + 1
            else:
                omitted += 1
    if not matches:
        return _result(config, f"no matches for {args['pattern']!r} in {rel}")
    text = "\n".join(lines)
    if omitted:
        text += f"\n[... output truncated: {omitted} more matching lines omitted ...]"
    return _result(config, text, truncated=omitted > 0)


def _walk_files(ws: Workspace, base: Path):
    """Files below base in sorted order; symlinks are followed only while they stay inside."""
    if base.is_file():
        yield base
        return
    for dirpath, dirnames, filenames in os.walk(base):  # followlinks=False: no loops/escapes
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink():
                try:
                    target = path.resolve()
                except (RuntimeError, OSError):  # a link loop
                    continue
                if ws.root not in target.parents or not target.is_file():
                    continue
            yield path


def _text_lines(path: Path):
    """(line number, text) of a text file; binary and oversized files yield nothing."""
    try:  # never opens a FIFO, socket or device (NotRegularFileError is an OSError)
        data = read_regular(path, _SEARCH_MAX_FILE_BYTES)
    except OSError:
        return
    if b"\x00" in data[:8192]:
        return
    for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        yield i, line[:_MAX_LINE_CHARS]


# ----------------------------------------------------------------------------- read_file


def _read_file(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    rel = args["path"]
    path = ws.resolve(rel)
    if path.is_dir():
        entries = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        return failed_result(
            config, f"error: {rel} is a folder; it contains: {', '.join(entries)}", "is a folder"
        )
    if not path.exists():
        return failed_result(config, f"error: no such file: {rel}", "no such file")
    f = _open_regular(path)
    size = os.fstat(f.fileno()).st_size
    with f:
        head = f.read(8192)
    if b"\x00" in head:
        return failed_result(
            config, f"error: {rel} is a binary file ({size} bytes); not shown", "binary file"
        )
    start = args.get("start_line", 1)
    end = args.get("end_line")
    if end is not None and end < start:
        return failed_result(
            config, f"error: end_line {end} is before start_line {start}", "bad range"
        )
    # Lines are read lazily and reading stops at the output budget: a huge file costs at
    # most what is shown. The note at the end tells the model how to see more.
    budget = config.max_output_bytes - _STATUS_RESERVE
    width = max(4, len(str(end or 0)))
    shown: list[str] = []
    used = seen = 0
    stopped_at: int | None = None
    with io.TextIOWrapper(_open_regular(path), encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            seen = lineno
            if lineno < start:
                continue
            if end is not None and lineno > end:
                break
            text = line.rstrip("\n")
            if len(text) > _MAX_LINE_CHARS:
                text = text[:_MAX_LINE_CHARS] + f" [... line cut at {_MAX_LINE_CHARS} chars]"
            entry = f"{lineno:>{width}}| {text}"
            if used + len(entry.encode()) + 1 > budget and shown:
                stopped_at = lineno
                break
            shown.append(entry)
            used += len(entry.encode()) + 1
    if not shown:
        if seen == 0:
            return _result(config, f"{rel} is empty")
        msg = f"error: start_line {start} is past the end of {rel} ({seen} lines)"
        return failed_result(config, msg, "bad range")
    text = "\n".join(shown)
    if stopped_at is not None:
        text += (
            f"\n[... output truncated: {rel} continues at line {stopped_at}; "
            "read further with start_line/end_line ...]"
        )
    return _result(config, text, truncated=stopped_at is not None)


def _open_regular(path: Path):
    """A binary file object for a regular file; NotRegularFileError for a FIFO, socket or
    device (opened without blocking, checked before anything is read)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFileError(errno.EINVAL, "not a regular file", str(path))
    return os.fdopen(fd, "rb")


# ----------------------------------------------------------------------------- edit_file


def _edit_file(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    rel, old, new = args["path"], args["old"], args["new"]
    path = ws.resolve(rel, for_write=True)
    if not old:
        return failed_result(
            config, "error: `old` must not be empty (create files with apply_patch)", "bad edit"
        )
    if not path.exists():
        return failed_result(config, f"error: no such file: {rel}", "no such file")
    try:  # newline="": keep \r\n as is
        with io.TextIOWrapper(_open_regular(path), encoding="utf-8", newline="") as f:
            text = f.read()
    except UnicodeDecodeError:
        return failed_result(config, f"error: {rel} is not a UTF-8 text file", "binary file")
    count = text.count(old)
    if count == 0:
        return failed_result(config, f"error: old text not found in {rel}", "old text not found")
    if count > 1:
        msg = f"error: old text occurs {count} times in {rel}; include more context"
        return failed_result(config, msg, "old text ambiguous")
    updated = text.replace(old, new, 1)
    if len(updated.encode()) > config.max_file_bytes:
        return failed_result(
            config, f"error: {rel} would exceed {config.max_file_bytes} bytes", "too large"
        )
    _write_no_follow(path, updated)
    first = text[: text.index(old)].count("\n") + 1
    last = first + new.count("\n")
    return _result(config, f"edited {rel}: replaced 1 occurrence (now lines {first}-{last})")


def _write_no_follow(path: Path, text: str) -> None:
    """Write without following a symlink planted at the last component."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)


# ----------------------------------------------------------------------------- apply_patch


def _apply_patch(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    # Imported here: the patch module is only needed by this tool.
    from components.tasks.patching import PatchError, apply_unified_diff, parse_unified_diff

    patch = args["patch"]
    try:
        comparisons = 0
        for fp in parse_unified_diff(patch):
            for rel in (fp.old_path, fp.new_path):
                if rel is not None:
                    path = ws.resolve(rel, for_write=True)  # no escapes, no writes via links
                    comparisons += _patch_work(path, rel, fp.hunks)
        if comparisons > _PATCH_MAX_COMPARISONS:
            raise PatchError(
                f"the hunks' search would take up to {comparisons} line comparisons (limit "
                f"{_PATCH_MAX_COMPARISONS}): patch a smaller file, or use edit_file"
            )
        changed = apply_unified_diff(ws.root, patch)
    except PatchError as e:
        return failed_result(config, f"error: patch not applied: {e}", "patch failed")
    except UnicodeDecodeError:
        return failed_result(config, "error: patch not applied: a file it names is not UTF-8 "
                             "text (binary files cannot be patched)", "binary file")  # fmt: skip
    if not changed:
        return failed_result(config, "error: the patch contains no file changes", "patch failed")
    return _result(config, f"applied patch: {', '.join(changed)}")


def _patch_work(path: Path, rel: str, hunks: list) -> int:
    """The most line comparisons the hunk search can make in the file at `path` (0 when
    absent); PatchError for a file that is not regular or is over the size limit."""
    from components.tasks.patching import PatchError

    try:
        st = path.stat()
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(st.st_mode):
        raise PatchError(f"{rel}: not a regular file (a FIFO, socket, device or folder)")
    if st.st_size > _PATCH_MAX_FILE_BYTES:
        raise PatchError(f"{rel}: {st.st_size} bytes, over the {_PATCH_MAX_FILE_BYTES}-byte "
                         "limit of apply_patch")  # fmt: skip
    lines = read_regular(path, _PATCH_MAX_FILE_BYTES).count(b"\n") + 1
    return sum(2 * lines * max(1, sum(tag in " -" for tag, _ in h.lines)) for h in hunks)


def _finish(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    return _result(config, "episode finished")


_HANDLERS = {
    "run_command": _run_command,
    "search": _search,
    "read_file": _read_file,
    "edit_file": _edit_file,
    "apply_patch": _apply_patch,
    "finish": _finish,
}
