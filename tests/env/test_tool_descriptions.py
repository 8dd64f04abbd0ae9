"""Each tool's description (what the system prompt promises) against what the tool returns.

Every test runs its tool for real in an episode on a generated task and checks each claim
of the description. CHECKED pins the descriptions these tests check: a changed description
(a new promise) fails `test_descriptions_are_the_checked_ones` until its claims have a check
here. A description that promises numbered lines must show them (`_numbered_lines`): the
old list_fixes text did, and its listing had none.
"""

import re
import shlex

import pytest

from components.env.config import EnvConfig
from components.env.episode import Action, EpisodeEnv
from components.env.tool_sets import TOOL_SPECS
from components.env.tool_sets.fix_search.fixes import listed_ids
from components.sandbox.config import DEFAULT_ALLOWED_PROGRAMS, SandboxConfig
from components.scripted.reference import OraclePolicy, fixed_files, minimal_edits

CHECKED = {
    "run_command": (
        "Run one program in the repository (allowed by default: "
        f"{', '.join(DEFAULT_ALLOWED_PROGRAMS)}; argv is parsed without a shell: no pipes, "
        "redirects or globs); prints its output, then its exit code. "
        "Example: python -m pytest -q"
    ),
    "search": "Search file contents for a regular expression; prints path:line: text.",
    "read_file": (
        "Show a file's lines, each prefixed with its number (`12| text`), optionally only "
        "lines start_line..end_line."
    ),
    "edit_file": "Replace exactly one occurrence of `old` with `new` in a file.",
    "apply_patch": "Apply a unified diff (paths relative to the repository root).",
    "edit_lines": (
        "Replace lines start..end of a file (the numbers read_file shows) with `text`; "
        "end = start - 1 inserts `text` before line start. Shows the edited lines after."
    ),
    "list_fixes": (
        "Run the tests and list the one-edit candidate fixes of the module they blame (or "
        "of `path`): the test summary, then one line per kind of change, e.g. "
        "`cmp (2): 1) line 5: <= -> < | 2) ...`, whose ids are kind-number (cmp-1, cmp-2)."
    ),
    "try_fix": (
        "Apply candidate `id` of the last list_fixes (undoing any earlier try), rerun the "
        "tests and say whether they PASSED or FAILED."
    ),
    "finish": "End the episode with a short summary of what was changed.",
}
_PROMISES_NUMBERED = re.compile(r"numbered lines|line numbers|prefixed with its number")
_NUMBERED = re.compile(r"^\s*(\d+)\| (.*)$")


def _described(tool: str) -> str:
    return TOOL_SPECS[tool]["description"]


def _numbered_lines(observation: str) -> list[tuple[int, str]]:
    return [(int(m[1]), m[2]) for m in map(_NUMBERED.match, observation.splitlines()) if m]


def _check_numbering_promise(tool: str, observation: str) -> None:
    if _PROMISES_NUMBERED.search(_described(tool)):
        assert _numbered_lines(observation), f"{tool} promises numbered lines and shows none"


@pytest.fixture(scope="module")
def case(suite_tasks):
    """A task whose reference fix is one listed candidate: (task, module, buggy, fixed, id)."""
    for task in suite_tasks:
        plan = OraclePolicy(style="fixes", recovery_rate=0.0, fallback=False).plan(task)
        tries = [a.arguments["id"] for a in plan if a.tool == "try_fix"]
        files = fixed_files(task)
        if tries and len(files) == 1:
            module, (before, after) = next(iter(files.items()))
            return task, module, before, after, tries[0]
    pytest.fail("no generated task has its fix among the candidates")


@pytest.fixture
def env(case):
    episode = EpisodeEnv(case[0], EnvConfig(max_steps=64), SandboxConfig(), policy_name="t")
    yield episode
    episode.workspace.cleanup()


@pytest.fixture
def fix_env(case):
    """An episode with the fix_search tool set (list_fixes / try_fix)."""
    episode = EpisodeEnv(case[0], EnvConfig(tool_set="fix_search", max_steps=64),
                         SandboxConfig(), policy_name="t")  # fmt: skip
    yield episode
    episode.workspace.cleanup()


@pytest.fixture
def line_env(case):
    """An episode with the line_edit tool set (edit_lines)."""
    episode = EpisodeEnv(case[0], EnvConfig(tool_set="line_edit", max_steps=64),
                         SandboxConfig(), policy_name="t")  # fmt: skip
    yield episode
    episode.workspace.cleanup()


def _run(env: EpisodeEnv, tool: str, **arguments) -> dict:
    return env.step(Action(tool, arguments))


def _module_text(env: EpisodeEnv, module: str) -> str:
    return env.workspace.resolve(module).read_text()


def test_descriptions_are_the_checked_ones():
    assert {name: spec["description"] for name, spec in TOOL_SPECS.items()} == CHECKED


def test_run_command_allow_list_shell_and_exit_code(env, case):
    allowed = re.search(r"allowed by default: ([^;]+);", _described("run_command"))[1]
    assert tuple(allowed.split(", ")) == SandboxConfig().allowed_programs
    for program in allowed.split(", "):
        observation = _run(env, "run_command", cmd=f"{program} --version")["observation"]
        assert "not in the allow-list" not in observation and "not allowed" not in observation
    for program in ("bash", "sh", "env"):
        event = _run(env, "run_command", cmd=f"{program} -c true")
        assert event.get("error") and "not in the allow-list" in event["observation"]
    # No shell: a pipe and a redirect are arguments, a glob is a literal name.
    piped = _run(env, "run_command", cmd="echo a | cat > out.txt")["observation"]
    assert (
        piped.splitlines()[0] == "a | cat > out.txt"
        and not (env.workspace.root / "out.txt").exists()
    )
    assert "cannot access '*.py'" in _run(env, "run_command", cmd="ls *.py")["observation"]
    # Output, then the exit code; the example runs the (failing) tests.
    example = re.search(r"Example: (.+)$", _described("run_command"))[1]
    observation = _run(env, "run_command", cmd=example)["observation"]
    assert re.search(r"\d+ failed", observation) and observation.endswith("exit code 1")
    assert _run(env, "run_command", cmd="true")["observation"] == "exit code 0"


def test_search_prints_path_line_text(env, case):
    _, module, before, _, _ = case
    observation = _run(env, "search", pattern=r"def \w+")["observation"]
    hits = [re.match(r"^(\S+):(\d+): (.*)$", line) for line in observation.splitlines()]
    assert hits and all(hits)
    assert any(h[1] == module for h in hits)
    for h in hits:
        text = env.workspace.resolve(h[1]).read_text().splitlines()[int(h[2]) - 1]
        assert h[3] == text and re.search(r"def \w+", text)


def test_read_file_numbers_each_line_and_reads_a_range(env, case):
    _, module, before, _, _ = case
    lines = before.splitlines()
    whole = _run(env, "read_file", path=module)["observation"]
    _check_numbering_promise("read_file", whole)
    assert _numbered_lines(whole) == list(enumerate(lines, start=1))
    part = _run(env, "read_file", path=module, start_line=2, end_line=3)["observation"]
    assert _numbered_lines(part) == [(2, lines[1]), (3, lines[2])]


def test_edit_file_replaces_exactly_one_occurrence(env, case):
    _, module, before, after, _ = case
    ambiguous = _run(env, "edit_file", path=module, old="\n", new="\n\n")
    assert ambiguous.get("error") and "occurs" in ambiguous["observation"]
    assert _module_text(env, module) == before
    edit = minimal_edits(module, before, after)[0]
    assert not _run(env, "edit_file", path=module, old=edit.old, new=edit.new).get("error")
    assert _module_text(env, module) == before.replace(edit.old, edit.new, 1)


def test_apply_patch_applies_a_diff_relative_to_the_root(env, case):
    task, module, _, after, _ = case
    event = _run(env, "apply_patch", patch=task.reference_patch())
    assert not event.get("error") and module in event["observation"]
    assert _module_text(env, module) == after


def test_edit_lines_replaces_or_inserts_read_file_numbered_lines_and_shows_them(line_env, case):
    env = line_env
    _, module, before, after, _ = case
    numbered = dict(_numbered_lines(_run(env, "read_file", path=module)["observation"]))
    lines = before.splitlines(keepends=True)
    changed = next(i for i, (a, b) in enumerate(zip(lines, after.splitlines(keepends=True),
                                                     strict=False), 1) if a != b)  # fmt: skip
    assert numbered[changed] == lines[changed - 1].rstrip("\n")  # read_file's numbers
    fixed = after.splitlines(keepends=True)[changed - 1]
    event = _run(env, "edit_lines", path=module, start=changed, end=changed, text=fixed)
    assert not event.get("error")
    text = _module_text(env, module)
    assert text.splitlines(keepends=True)[changed - 1] == fixed
    # Shows the edited lines after, numbered as read_file numbers them.
    shown = dict(_numbered_lines(event["observation"]))
    assert shown[changed] == fixed.rstrip("\n")
    assert all(text.splitlines()[n - 1] == t for n, t in shown.items())
    # end = start - 1 inserts before line start.
    event = _run(env, "edit_lines", path=module, start=1, end=0, text="# note")
    assert not event.get("error")
    assert _module_text(env, module) == "# note\n" + text
    assert dict(_numbered_lines(event["observation"]))[1] == "# note"


def _check_listing(env: EpisodeEnv, observation: str, module: str, before: str) -> None:
    _check_numbering_promise("list_fixes", observation)
    tests, listing = observation.split(f"\n\nCandidate fixes of {module} (", 1)
    assert env.ran_tests and "FAILED" in tests  # the test summary comes first
    rows = listing.split("\n", 1)[1].splitlines()
    kinds = [re.match(r"^(\w+) \((\d+)\): 1\) ", row) for row in rows]
    assert all(kinds) and len({k[1] for k in kinds}) == len(kinds)  # one line per kind
    ids = listed_ids(observation)
    assert all(re.fullmatch(r"[a-z]+-\d+", i) for i in ids)
    assert sorted(ids) == sorted(c.id for c in env.tool_state.listing.candidates)
    # Ids, not the module: no numbered lines and none of its source lines.
    assert not _numbered_lines(observation)
    source = {line.strip() for line in before.splitlines() if line.strip()}
    assert not source & {line.strip() for line in observation.splitlines()}


def test_list_fixes_lists_kind_number_ids_of_the_blamed_module(fix_env, case):
    env = fix_env
    _, module, before, _, _ = case
    _check_listing(env, _run(env, "list_fixes")["observation"], module, before)
    _check_listing(env, _run(env, "list_fixes", path=module)["observation"], module, before)


def test_try_fix_undoes_the_earlier_try_and_reports_the_tests(fix_env, case):
    env = fix_env
    task, module, _, _, right = case
    _run(env, "list_fixes")
    wrong = next(c.id for c in env.tool_state.listing.candidates if c.id != right)
    test_cmd = shlex.join(task.test_command)
    for fix_id in (wrong, right):
        observation = _run(env, "try_fix", id=fix_id)["observation"]
        assert _module_text(env, module) == env.tool_state.listing.get(fix_id).source
        verdict = re.match(rf"^{fix_id} applied \(.*\); tests (PASSED|FAILED)\n", observation)
        rerun = _run(env, "run_command", cmd=test_cmd)["observation"]
        assert verdict and (verdict[1] == "PASSED") == rerun.endswith("exit code 0")
    assert verdict[1] == "PASSED"


def test_finish_ends_the_episode_and_keeps_the_summary(env):
    _run(env, "finish", summary="nothing changed")
    assert env.done and env.end_reason == "finished"
    assert env.events[-2]["arguments"] == {"summary": "nothing changed"}
