"""The `line_edit` tool set: free-form tools where an edit names lines by number.

Issue 43: a pretrained 135M policy could not copy `old` text exactly (24 of 35 edit_file
calls missed) and long calls were cut at the turn's token limit. Here the main edit is
`edit_lines{path, start, end, text}`: the numbers are the ones read_file shows, so nothing
has to be copied but the new lines. `edit_file` stays, with its fallbacks (line-number
prefixes dropped, whitespace ignored); `apply_patch` is left out (a diff is the longest
call to write). Every edit of a Python file that would stop it parsing is refused, and a
failing test run names the blamed source line (components/env/tool_sets/commands.py). No
reward terms or decoding constraint of its own."""

from __future__ import annotations

from components.env.tool_sets.shared import SHARED_TOOLS
from components.env.tool_sets.types import ToolSet, tools_of

TOOL_SET = ToolSet(
    "line_edit",
    tools_of(*(SHARED_TOOLS[name] for name in (
        "run_command", "read_file", "search", "edit_lines", "edit_file", "finish"))),
    summary="free-form tools editing by line number (edit_lines); for a small pretrained model",
)  # fmt: skip
