"""The `free_form` tool set (the default): run, read, search, edit, patch, finish. It
reaches any bug, for any model that can write an edit; it has no reward terms of its own
and no decoding constraint."""

from __future__ import annotations

from components.env.tool_sets.shared import SHARED_TOOLS
from components.env.tool_sets.types import ToolSet, tools_of

TOOL_SET = ToolSet(
    "free_form",
    tools_of(*(SHARED_TOOLS[name] for name in (
        "run_command", "read_file", "search", "edit_file", "apply_patch", "finish"))),
    summary="free-form coding tools: run, read, search, edit, patch; reaches any bug",
)  # fmt: skip
