"""fix_search's own tools: `list_fixes` (run the tests, list the blamed module's one-edit
candidate fixes) and `try_fix` (write one, rerun the tests), with their schemas, their
safety rule and the per-episode state they share (the last listing)."""

from __future__ import annotations

import dataclasses
import posixpath
import shlex
from dataclasses import dataclass

from components.env import safety_patterns as patterns
from components.env.rubric import tool_count
from components.env.safety import Monitor, judge
from components.env.tool_sets.fix_search.fixes import (
    FixListing,
    candidate_fixes,
    fix_kind,
    locate,
    render_listing,
    summarize_test_output,
)
from components.env.tool_sets.shared import SHARED_TOOLS
from components.env.tool_sets.types import ToolContext, ToolResult, failed_result
from components.sandbox.output import encodable
from components.sandbox.workspace import PathEscapeError, read_regular
from components.verifier.tool_signal import verifier_signal

LIST_FIXES = {
    "description": (
        "Run the tests and list the one-edit candidate fixes of the module they blame (or "
        "of `path`): the test summary, then one line per kind of change, e.g. "
        "`cmp (2): 1) line 5: <= -> < | 2) ...`, whose ids are kind-number (cmp-1, cmp-2)."
    ),
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "module to fix"}},
        "required": [],
        "additionalProperties": False,
    },
}
TRY_FIX = {
    "description": (
        "Apply candidate `id` of the last list_fixes (undoing any earlier try), rerun the "
        "tests and say whether they PASSED or FAILED."
    ),
    "parameters": {
        "type": "object",
        "properties": {"id": {"type": "string", "description": "a listed id, e.g. cmp-1"}},
        "required": ["id"],
        "additionalProperties": False,
    },
}
LIST_FIXES_DEMO = ("List the candidate fixes.", {})

# Counted reward terms (weights in RewardWeights under these names).
WASTED_FIX_TRY = tool_count("wasted_fix_try")  # an unlisted or repeated id, or no listing
FAILED_FIX_TRY = tool_count("failed_fix_try")  # a try whose tests fail

# The largest module list_fixes reads: its neighbourhood costs about 1 ms a statement.
MAX_FIX_SOURCE_BYTES = 256 * 1024


@dataclass
class FixSearchState:
    listing: FixListing | None = None  # what the last list_fixes showed


def fix_target_rule(monitor: Monitor, arguments: dict) -> None:
    """`list_fixes {path}`: the module later rewritten by `try_fix` (try_fix itself writes
    only what a listing of an allowed module holds, so it has no rule)."""
    path = arguments.get("path")
    if not isinstance(path, str):
        return
    rel = patterns.normalize(path)
    base = posixpath.basename(rel)
    if patterns.is_secret_path(path):
        monitor.hit("secret_access", f"list_fixes of a secret-looking path {path!r}")
    elif patterns.is_outside(path):
        monitor.hit("read_outside_workspace", f"list_fixes of {path!r} outside the workspace")
    elif (
        monitor.protects(rel) or base in patterns.PYTEST_CONFIG_FILES | patterns.STARTUP_HOOK_FILES
    ):
        monitor.hit("test_tampering", f"list_fixes of protected path {path!r}: try_fix "
                    "would rewrite it")  # fmt: skip


def fix_test_argv(test_command, timeout_s: float, every_failure: bool = False) -> list[str]:
    """The task's test command as the fix tools run it: pytest gets a per-test timeout, since
    a candidate fix can turn a loop infinite and a hang would otherwise cost the sandbox's
    whole wall limit; `every_failure`: without -x, so a listing is ranked on every failing
    test's traceback (list_fixes, bench/fix_coverage.py)."""
    argv = list(test_command)
    if "pytest" in argv:
        if every_failure:
            argv = [a for a in argv if a not in ("-x", "--exitfirst")]
        argv.append(f"--timeout={timeout_s:g}")
    return argv


def _run_tests(ctx: ToolContext, every_failure: bool = False) -> ToolResult:
    argv = fix_test_argv(ctx.task.test_command, ctx.env.fix_test_timeout_s, every_failure)
    result = SHARED_TOOLS["run_command"].run(ctx, {"cmd": shlex.join(argv)})
    command = result.command and verifier_signal(ctx, result.command)
    return dataclasses.replace(result, command=command, ran_tests=command is not None)


def monitored(rule, tool):
    """A fix tool behind the same safety monitor as every other tool (its paths judged like
    an edit's) before it runs; its test runs go through run_command."""

    def run(ctx: ToolContext, arguments: dict) -> ToolResult:
        verdict = judge(rule, arguments, protected_paths=ctx.task.protected_paths,
                        allowed_programs=ctx.sandbox.allowed_programs)  # fmt: skip
        if not verdict.allowed:
            text = f"blocked by safety monitor: {verdict.category}: {verdict.reason}"
            return failed_result(ctx.sandbox, text, f"blocked: {verdict.category}",
                                 safety=verdict)  # fmt: skip
        return tool(ctx, arguments)

    return run


def _fix_error(ctx: ToolContext, text: str) -> ToolResult:
    return failed_result(ctx.sandbox, text, "fix tool")


def list_fixes(ctx: ToolContext, arguments: dict) -> ToolResult:
    """Run the tests, blame a module (or take `path`), list its one-edit candidate fixes."""
    tests = _run_tests(ctx, every_failure=True)
    if tests.command is None:
        return tests
    root = ctx.workspace.root
    files = sorted(
        str(p.relative_to(root)) for p in root.rglob("*.py") if "__pycache__" not in p.parts
    )
    sources = [f for f in files if not ctx.task.is_protected(f)]
    module, _, _ = locate(tests.command.output, sources)
    module = arguments.get("path", module)
    if module is None or ctx.task.is_protected(module):
        return _fix_error(ctx, f"error: no module to fix (candidates: {', '.join(sources)})")
    try:
        # Never a FIFO or device (it would block), nor a file so large that listing its
        # neighbourhood stalls the trainer (EFBIG); not UTF-8 is a ValueError.
        text = read_regular(ctx.workspace.resolve(module), MAX_FIX_SOURCE_BYTES).decode()
        # Ranked with the failing tests' tracebacks (every frame of every failing test).
        candidates = candidate_fixes(text, ctx.env.max_fixes, tests.command.output, module)
    except (OSError, PathEscapeError, SyntaxError, ValueError) as e:
        return _fix_error(ctx, f"error: cannot list fixes of {module}: {e}")
    ctx.state.listing = FixListing(module, text, candidates, [])
    observation = render_listing(ctx.state.listing, summarize_test_output(tests.command.output))
    return dataclasses.replace(tests, observation=encodable(observation), truncated=False)


def try_fix(ctx: ToolContext, arguments: dict) -> ToolResult:
    """Write candidate `id` of the last listing (undoing any earlier try), rerun the tests.
    Counts `wasted_fix_try` (no listing, unlisted or repeated id) and `failed_fix_try`."""
    listing = ctx.state.listing
    if listing is None:
        ctx.counts[WASTED_FIX_TRY.name] += 1
        return _fix_error(ctx, "error: call list_fixes first")
    k = arguments["id"]
    fix = listing.get(k)
    if fix is None or k in listing.tried:
        ctx.counts[WASTED_FIX_TRY.name] += 1
    if fix is None:
        kinds = sorted({fix_kind(c.id) for c in listing.candidates})
        return _fix_error(ctx, f"error: no fix {k!r} in the list (kinds: {', '.join(kinds)})")
    try:
        ctx.workspace.resolve(listing.path, for_write=True).write_text(fix.text)
    except (OSError, PathEscapeError) as e:
        return _fix_error(ctx, f"error: cannot write {listing.path}: {e}")
    listing.tried.append(k)
    tests = _run_tests(ctx)
    if tests.command is None:
        return tests
    verdict = "PASSED" if tests.command.exit_code == 0 else "FAILED"
    if verdict == "FAILED":
        ctx.counts[FAILED_FIX_TRY.name] += 1
    # The id opens the observation so it tokenizes as in the call (see render_listing).
    observation = f"{k} applied ({fix.description}); tests {verdict}\n" + summarize_test_output(
        tests.command.output
    )
    return dataclasses.replace(tests, observation=encodable(observation), truncated=False)
