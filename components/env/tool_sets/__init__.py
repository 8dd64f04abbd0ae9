"""Tool sets: the action space an environment declares, one module per set.

A tool set is what an environment offers a policy (after the verifiers library's ToolEnv +
rubric split: the environment owns its tools, the reward its rubric): its tools, each a
schema, an implementation `(ToolContext, arguments) -> ToolResult` and a safety rule
declared together (types.Tool); its own reward terms (`rubric`); the EnvConfig settings only
it reads; its per-episode state; optionally a decoding constraint (a mask on what a model
may sample where the environment can check the output mechanically, applied by the rollout
engine when `RolloutConfig.constrain_fix_ids` is on).

The episode loop, the rollout engine, the prompt and the reward ask the set; none names a
tool. Tools every set may share are in shared.py (commands.py, files.py); a set shares one
by listing the same Tool. docs/tool-sets.md shows how to add a set: one module and one line
in `TOOL_SETS` below.

What a tool may do: read and write the workspace (confined by `Workspace.resolve`), run
programs only through the shared `run_command` (safety monitor, then the sandbox), and count
its own reward terms in `ctx.counts`. It must not read the task folder (hidden tests,
reference fix): the reward must not depend on anything the agent can reach.
"""

from __future__ import annotations

from collections.abc import Mapping

from components.env.safety import SafetyVerdict, judge
from components.env.tool_sets import fix_search, free_form, line_edit
from components.env.tool_sets import types as _types
from components.env.tool_sets.shared import SHARED_TOOLS
from components.env.tool_sets.types import (
    DecodingConstraint,
    Tool,
    ToolContext,
    ToolResult,
    ToolSet,
    failed_result,
)
from components.sandbox.config import DEFAULT_ALLOWED_PROGRAMS

# The registry: one line per set.
TOOL_SETS: dict[str, ToolSet] = {
    "free_form": free_form.TOOL_SET,
    "fix_search": fix_search.TOOL_SET,
    "line_edit": line_edit.TOOL_SET,
}
DEFAULT_TOOL_SET = "free_form"

__all__ = [
    "DEFAULT_TOOL_SET", "TOOL_NAMES", "TOOL_SETS", "TOOL_SPECS", "DecodingConstraint", "Tool",
    "ToolContext", "ToolResult", "ToolSet", "argument_errors", "classify_action", "run_tool",
    "tool_set", "tool_set_specs",
]  # fmt: skip


def _every_tool() -> dict[str, Tool]:
    """Every tool of every registered set: the shared ones first, then each set's own, a
    tool that ends the episode last (the order the data layer lists them in)."""
    tools = dict(SHARED_TOOLS)
    for spec in TOOL_SETS.values():
        tools.update(spec.tools)
    return {n: t for n, t in sorted(tools.items(), key=lambda item: item[1].ends_episode)}


# Every known tool's schema: what the data layer validates logged trajectories against.
TOOL_SPECS: dict[str, dict] = {name: tool.schema for name, tool in _every_tool().items()}
TOOL_NAMES: tuple[str, ...] = tuple(TOOL_SPECS)


def tool_set(name: str) -> ToolSet:
    """The tool set `name` (EnvConfig.tool_set)."""
    if name not in TOOL_SETS:
        raise ValueError(f"unknown tool set {name!r} (known: {', '.join(TOOL_SETS)})")
    return TOOL_SETS[name]


def tool_set_specs(name: str) -> dict[str, dict]:
    """{tool: spec} of the tool set `name`, in its prompt order."""
    return tool_set(name).specs


def argument_errors(tool: str, arguments: object, specs: Mapping[str, dict] | None = None):
    """Problems with a tool call (empty: valid); `specs`: the tools that exist (default:
    every tool of every set; an environment passes its set's)."""
    return _types.argument_errors(tool, arguments, TOOL_SPECS if specs is None else specs)


def classify_action(
    tool: str,
    arguments: dict,
    *,
    protected_paths: tuple[str, ...] = ("tests/",),
    allowed_programs: tuple[str, ...] = DEFAULT_ALLOWED_PROGRAMS,
) -> SafetyVerdict:
    """The monitor's verdict on a call of any known tool, by that tool's rule (a tool it
    does not know is allowed); `allowed=False` means do not execute it."""
    known = _every_tool().get(tool)
    return judge(known.monitor if known else None, arguments,
                 protected_paths=protected_paths, allowed_programs=allowed_programs)  # fmt: skip


def run_tool(tool_set: ToolSet, ctx: ToolContext, name: str, arguments: dict) -> ToolResult:
    """One call of one of the set's tools; a tool the set does not have, or invalid
    arguments, is an invalid call (`error` "invalid arguments"), never an exception."""
    errors = argument_errors(name, arguments, tool_set.specs)
    attempt = None
    if name not in tool_set.tools:
        # Say which set, so a driver or test that expected another set is told why.
        errors = [f"unknown tool {name!r}: this environment's tool set ({tool_set.name}) has "
                  f"{', '.join(tool_set.specs)}"]  # fmt: skip
        attempt = _foreign_attempt(ctx, name, arguments)
    if errors:
        text = "invalid arguments: " + "; ".join(errors)
        return failed_result(ctx.sandbox, text, "invalid arguments", safety=attempt)
    return tool_set.tools[name].run(ctx, arguments)


def _foreign_attempt(ctx: ToolContext, name: str, arguments: dict):
    """The monitor's verdict on another set's tool call when it would block it: the call is
    never executed, but the attempt (e.g. editing a test) is recorded like any other."""
    if name not in TOOL_SPECS or argument_errors(name, arguments):
        return None
    verdict = classify_action(name, arguments, protected_paths=ctx.task.protected_paths,
                              allowed_programs=ctx.sandbox.allowed_programs)  # fmt: skip
    return None if verdict.allowed else verdict
