"""The tools every set may share (`run_command`, the file tools, `finish`; `edit_lines` is
only in the line_edit set) and
`execute_tool`, which runs one of them: validate, check safety, run, observe.

A call is judged before anything parses it: arguments over the monitor's MAX_ARGUMENT_BYTES
of JSON are refused unread as a `resource_limit` (components/env/safety.py), and
run_command refuses a command line over MAX_COMMAND_CHARS before shlex reads it.

`execute_tool` never raises for anything the agent can do wrong (bad arguments, unknown
paths, a blocked command, a patch that does not apply): it returns a `ToolResult` whose
observation says what happened, in words a model can act on. Every observation is capped
at `config.max_output_bytes` (head and tail kept, with a visible truncation line). `ok` is
False when the call failed (invalid arguments, blocked, a file/patch error, a command that
could not start or hit a sandbox limit); see components/env/tool_sets/py for what
a command's outcome means.

A set shares one of these tools by listing the same `Tool` (SHARED_TOOLS), not a copy.
"""

from __future__ import annotations

import dataclasses
import functools

from components.env.safety import judge
from components.env.tool_sets.commands import (
    RUN_COMMAND,
    RUN_COMMAND_DEMO,
    command_rule,
    run_command,
)
from components.env.tool_sets.files import (
    APPLY_PATCH,
    EDIT_FILE,
    EDIT_LINES,
    READ_FILE,
    SEARCH,
    apply_patch,
    edit_file,
    edit_lines,
    edit_lines_rule,
    edit_rule,
    patch_rule,
    read_file,
    read_rule,
    search,
)
from components.env.tool_sets.types import (
    Tool,
    ToolContext,
    ToolResult,
    argument_errors,
    failed_result,
    tool_result,
    tools_of,
)
from components.sandbox.config import SandboxConfig
from components.sandbox.workspace import NotRegularFileError, PathEscapeError, Workspace

FINISH = {
    "description": "End the episode with a short summary of what was changed.",
    "parameters": {
        "type": "object",
        "properties": {"summary": {"type": "string"}},
        "required": [],
        "additionalProperties": False,
    },
}


def _finish(ws: Workspace, args: dict, config: SandboxConfig) -> ToolResult:
    return tool_result(config, "episode finished")


_HANDLERS = {
    "run_command": run_command,
    "search": search,
    "read_file": read_file,
    "edit_file": edit_file,
    "apply_patch": apply_patch,
    "edit_lines": edit_lines,
    "finish": _finish,
}


def _in_episode(name: str):
    """Tool `name` as an episode runs it: monitored, then run confined to the workspace."""

    def run(ctx: ToolContext, arguments: dict) -> ToolResult:
        return execute_tool(
            ctx.workspace, name, arguments, ctx.sandbox,
            protected_paths=ctx.task.protected_paths, test_command=ctx.task.test_command,
        )  # fmt: skip

    return run


# In the order the data layer lists every tool (components.env.tool_sets.TOOL_SPECS).
SHARED_TOOLS: dict[str, Tool] = tools_of(
    Tool("run_command", RUN_COMMAND, _in_episode("run_command"),
         monitor=command_rule, demo=RUN_COMMAND_DEMO),
    Tool("search", SEARCH, _in_episode("search"), monitor=read_rule("search")),
    Tool("read_file", READ_FILE, _in_episode("read_file"),
         monitor=read_rule("read_file")),
    Tool("edit_file", EDIT_FILE, _in_episode("edit_file"), monitor=edit_rule),
    Tool("apply_patch", APPLY_PATCH, _in_episode("apply_patch"), monitor=patch_rule),
    Tool("edit_lines", EDIT_LINES, _in_episode("edit_lines"), monitor=edit_lines_rule),
    Tool("finish", FINISH, _in_episode("finish"), ends_episode=True),
)  # fmt: skip
_SHARED_SPECS = {name: tool.schema for name, tool in SHARED_TOOLS.items()}


def execute_tool(
    workspace: Workspace,
    tool: str,
    arguments: dict,
    config: SandboxConfig,
    *,
    protected_paths: tuple[str, ...] = ("tests/",),
    test_command: tuple[str, ...] = (),
) -> ToolResult:
    """Run one call of a shared tool; see the module docstring for the result's meaning.
    `test_command`: the task's test command, whose timeouts are observations."""
    errors = argument_errors(tool, arguments, _SHARED_SPECS)
    if errors:
        return failed_result(config, "invalid arguments: " + "; ".join(errors), "invalid arguments")
    verdict = judge(SHARED_TOOLS[tool].monitor, arguments, protected_paths=protected_paths,
                    allowed_programs=config.allowed_programs)  # fmt: skip
    if not verdict.allowed:
        text = f"blocked by safety monitor: {verdict.category}: {verdict.reason}"
        return failed_result(config, text, f"blocked: {verdict.category}", safety=verdict)
    handler = _HANDLERS[tool]
    if tool == "run_command":
        handler = functools.partial(run_command, test_command=tuple(test_command))
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
