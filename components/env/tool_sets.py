"""Tool sets: the action space an environment declares, as plain data and functions.

A tool set is what an environment offers a policy (after the verifiers library's ToolEnv +
rubric split: the environment owns its tools, the reward its rubric):
- its tools: the specs and counted reward terms declared in `tool_specs.TOOL_SETS` (the
  system prompt lists exactly these tools, the reward breakdown exactly the common terms
  plus these), and here one implementation per tool, `(ToolContext, arguments) -> ToolResult`;
- its per-episode state (`new_state`), which only its own implementations touch;
- optionally a decoding constraint: a mask on what a model may sample where the
  environment can check the output mechanically (the rollout engine applies it when
  `RolloutConfig.constrain_fix_ids` is on).

The episode loop (EpisodeEnv) and the rollout engine ask the set; neither names a tool.
Two sets ship: `free_form` (the default: run, read, search, edit, patch, finish; reaches any
bug) and `fix_search` (list and try one-edit candidate fixes; a small model only has to
choose, but it reaches only the fixes the listing holds). docs/tool-sets.md shows how to add
one. A set is a value in `TOOL_SET_IMPLS`, not a subclass: two sets share a tool by sharing
its function (`run_command` and `finish` are in both).

What a tool may do: read and write the workspace (confined by `Workspace.resolve`), run
programs only through `tools.execute_tool` (safety monitor, then the sandbox), and count its
own reward terms in `ctx.counts`. It must not read the task folder (hidden tests, reference
fix): the reward must not depend on anything the agent can reach.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.env.config import EnvConfig
from components.env.fixes import (
    FixListing,
    candidate_fixes,
    fix_kind,
    locate,
    render_listing,
    summarize_test_output,
)
from components.env.safety import classify_action
from components.env.tool_specs import (
    TOOL_SETS,
    TOOL_SPECS,
    ToolSetSpec,
    argument_errors,
    tool_set_specs,
)
from components.env.tools import ToolResult, execute_tool, failed_result
from components.sandbox.config import SandboxConfig
from components.sandbox.output import encodable
from components.sandbox.workspace import PathEscapeError, Workspace, read_regular
from components.tasks.task import Task


@dataclass
class ToolContext:
    """What a tool implementation may use in one episode."""

    workspace: Workspace
    sandbox: SandboxConfig  # the agent's sandbox (the task folder hidden)
    task: Task
    env: EnvConfig
    state: Any  # the tool set's own per-episode state (`ToolSet.new_state()`)
    counts: Counter[str] = field(default_factory=Counter)  # the set's counted reward terms


Tool = Callable[[ToolContext, dict], ToolResult]


@dataclass(frozen=True)
class DecodingConstraint:
    """A mask on what a model may sample, per episode ("row").

    `live(state)`: this episode's constraint from the set's state (None: no mask this turn);
    `from_events(events)`: the same read back from a transcript, for a policy that sees only
    events; `logits_processor(tokenizer, prompt_width, rows)`: a transformers
    LogitsProcessor masking each row by its constraint. The sampled log-probs stay the
    model's own (components/rollout/constrain.py says why)."""

    summary: str
    live: Callable[[Any], Any]
    from_events: Callable[[Sequence[dict]], Any]
    logits_processor: Callable[[Any, int, Sequence[Any]], Any]


@dataclass(frozen=True)
class ToolSet:
    """An environment's tools: declaration (`spec`), implementations, state, constraint."""

    name: str
    spec: ToolSetSpec
    tools: Mapping[str, Tool]
    new_state: Callable[[], Any] = lambda: None
    constraint: DecodingConstraint | None = None

    @property
    def specs(self) -> dict[str, dict]:
        """{tool: OpenAI-style spec}, in prompt order."""
        return tool_set_specs(self.name)

    @property
    def counted_terms(self) -> tuple[str, ...]:
        return self.spec.counted_terms


def run_tool(tool_set: ToolSet, ctx: ToolContext, name: str, arguments: dict) -> ToolResult:
    """One call of one of the set's tools; a tool the set does not have, or invalid
    arguments, is an invalid call (`error` "invalid arguments"), never an exception."""
    errors = argument_errors(name, arguments, tool_set.specs)
    attempt = None
    if name not in tool_set.specs:
        # Say which set, so a driver or test that expected another set is told why.
        errors = [f"unknown tool {name!r}: this environment's tool set ({tool_set.name}) has "
                  f"{', '.join(tool_set.specs)}"]  # fmt: skip
        attempt = _foreign_attempt(ctx, name, arguments)
    if errors:
        text = "invalid arguments: " + "; ".join(errors)
        return failed_result(ctx.sandbox, text, "invalid arguments", safety=attempt)
    return tool_set.tools[name](ctx, arguments)


def _foreign_attempt(ctx: ToolContext, name: str, arguments: dict):
    """The monitor's verdict on another set's tool call when it would block it: the call is
    never executed, but the attempt (e.g. editing a test) is recorded like any other."""
    if name not in TOOL_SPECS or argument_errors(name, arguments):
        return None
    verdict = _monitor(ctx, name, arguments)
    return None if verdict.allowed else verdict


def _monitor(ctx: ToolContext, name: str, arguments: dict):
    """The safety monitor's verdict on one call in this episode (nothing is run)."""
    return classify_action(name, arguments, protected_paths=ctx.task.protected_paths,
                           allowed_programs=ctx.sandbox.allowed_programs)  # fmt: skip


# ----------------------------------------------------------------------------- free form


def _plain(name: str, ctx: ToolContext, arguments: dict) -> ToolResult:
    """A tool of components/env/tools.py: monitored, then run confined to the workspace."""
    return execute_tool(
        ctx.workspace, name, arguments, ctx.sandbox,
        protected_paths=ctx.task.protected_paths, test_command=ctx.task.test_command,
    )  # fmt: skip


def _plain_tools(*names: str) -> dict[str, Tool]:
    return {name: functools.partial(_plain, name) for name in names}


# ----------------------------------------------------------------------------- fix search


@dataclass
class FixSearchState:
    listing: FixListing | None = None  # what the last list_fixes showed


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
    result = _plain("run_command", ctx, {"cmd": shlex.join(argv)})
    return dataclasses.replace(result, ran_tests=result.command is not None)


def _monitored(tool: Tool, name: str) -> Tool:
    """The fix tools go past the same safety monitor as every other tool (their paths are
    judged like an edit's) before they run; their test runs go through run_command."""

    def run(ctx: ToolContext, arguments: dict) -> ToolResult:
        verdict = _monitor(ctx, name, arguments)
        if not verdict.allowed:
            text = f"blocked by safety monitor: {verdict.category}: {verdict.reason}"
            return failed_result(ctx.sandbox, text, f"blocked: {verdict.category}",
                                 safety=verdict)  # fmt: skip
        return tool(ctx, arguments)

    return run


# The largest module list_fixes reads: its neighbourhood costs about 1 ms a statement.
MAX_FIX_SOURCE_BYTES = 256 * 1024


def _fix_error(ctx: ToolContext, text: str) -> ToolResult:
    return failed_result(ctx.sandbox, text, "fix tool")


def _list_fixes(ctx: ToolContext, arguments: dict) -> ToolResult:
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


def _try_fix(ctx: ToolContext, arguments: dict) -> ToolResult:
    """Write candidate `id` of the last listing (undoing any earlier try), rerun the tests.
    Counts `wasted_fix_try` (no listing, unlisted or repeated id) and `failed_fix_try`."""
    listing = ctx.state.listing
    if listing is None:
        ctx.counts["wasted_fix_try"] += 1
        return _fix_error(ctx, "error: call list_fixes first")
    k = arguments["id"]
    fix = listing.get(k)
    if fix is None or k in listing.tried:
        ctx.counts["wasted_fix_try"] += 1
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
        ctx.counts["failed_fix_try"] += 1
    # The id opens the observation so it tokenizes as in the call (see render_listing).
    observation = f"{k} applied ({fix.description}); tests {verdict}\n" + summarize_test_output(
        tests.command.output
    )
    return dataclasses.replace(tests, observation=encodable(observation), truncated=False)


def _untried_ids(state: FixSearchState) -> list[str] | None:
    return None if state.listing is None else state.listing.untried_ids()


def _untried_ids_from_events(events: Sequence[dict]) -> list[str] | None:
    from components.rollout.constrain import untried_fix_ids

    return untried_fix_ids(events)


def _fix_id_processor(tokenizer, prompt_width: int, rows: Sequence[Any]):
    from components.rollout.constrain import FixIdLogitsProcessor

    return FixIdLogitsProcessor(tokenizer, prompt_width, rows)


# ----------------------------------------------------------------------------- registry

_FREE_FORM_TOOLS = _plain_tools(*TOOL_SETS["free_form"].tools)

TOOL_SET_IMPLS: dict[str, ToolSet] = {
    "free_form": ToolSet("free_form", TOOL_SETS["free_form"], _FREE_FORM_TOOLS),
    "fix_search": ToolSet(
        "fix_search",
        TOOL_SETS["fix_search"],
        {
            "list_fixes": _monitored(_list_fixes, "list_fixes"),
            "try_fix": _monitored(_try_fix, "try_fix"),
            "run_command": _FREE_FORM_TOOLS["run_command"],
            "finish": _FREE_FORM_TOOLS["finish"],
        },
        new_state=FixSearchState,
        constraint=DecodingConstraint(
            summary="inside a try_fix id string, only listed untried ids can be drawn",
            live=_untried_ids,
            from_events=_untried_ids_from_events,
            logits_processor=_fix_id_processor,
        ),
    ),
}


def tool_set(name: str) -> ToolSet:
    """The tool set `name` (EnvConfig.tool_set)."""
    if name not in TOOL_SET_IMPLS:
        raise ValueError(f"unknown tool set {name!r} (known: {', '.join(TOOL_SET_IMPLS)})")
    return TOOL_SET_IMPLS[name]
