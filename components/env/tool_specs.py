"""The environment's tool registry: names, argument schemas, the tool sets, an argument checker.

This is the contract shared by the sandbox (which executes tools), the data layer (which
validates logged trajectories against every known tool, `TOOL_NAMES`) and the policy (whose
system prompt lists the tools of one set). Schemas follow the OpenAI function-calling shape
so they can be handed to any chat model.

A tool set (`TOOL_SETS`) is the action space an environment declares: which of these tools
it offers (the system prompt lists exactly those) and which counted reward terms only its
tools can fire (the reward breakdown has exactly the common terms plus those). It is data
here, so the config, the prompt and the data layer can read it without the implementations;
components/env/tool_sets.py pairs each set with its implementations and decoding constraint.

Each description says what the tool returns, and nothing it does not:
tests/env/test_tool_descriptions.py runs every tool in an episode and checks the claims.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from components.sandbox.config import DEFAULT_ALLOWED_PROGRAMS

TOOL_SPECS: dict[str, dict] = {
    "run_command": {
        "description": (
            "Run one program in the repository (allowed by default: "
            f"{', '.join(DEFAULT_ALLOWED_PROGRAMS)}; argv is parsed without a shell: no pipes, "
            "redirects or globs); prints its output, then its exit code. "
            "Example: python -m pytest -q"
        ),
        "parameters": {
            "type": "object",
            "properties": {"cmd": {"type": "string", "description": "the command line"}},
            "required": ["cmd"],
            "additionalProperties": False,
        },
    },
    "search": {
        "description": "Search file contents for a regular expression; prints path:line: text.",
        "parameters": {
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Python regular expression"},
                "path": {"type": "string", "description": "file or folder (default: repo root)"},
            },
            "required": ["pattern"],
            "additionalProperties": False,
        },
    },
    "read_file": {
        "description": (
            "Show a file's lines, each prefixed with its number (`12| text`), optionally only "
            "lines start_line..end_line."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "start_line": {"type": "integer", "minimum": 1},
                "end_line": {"type": "integer", "minimum": 1},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    },
    "edit_file": {
        "description": "Replace exactly one occurrence of `old` with `new` in a file.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old": {"type": "string", "description": "exact text, must occur exactly once"},
                "new": {"type": "string"},
            },
            "required": ["path", "old", "new"],
            "additionalProperties": False,
        },
    },
    "apply_patch": {
        "description": "Apply a unified diff (paths relative to the repository root).",
        "parameters": {
            "type": "object",
            "properties": {"patch": {"type": "string"}},
            "required": ["patch"],
            "additionalProperties": False,
        },
    },
    "list_fixes": {
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
    },
    "try_fix": {
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
    },
    "finish": {
        "description": "End the episode with a short summary of what was changed.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": [],
            "additionalProperties": False,
        },
    },
}

TOOL_NAMES: tuple[str, ...] = tuple(TOOL_SPECS)


@dataclass(frozen=True)
class ToolSetSpec:
    """What a tool set declares: its tools (in the order the system prompt lists them), the
    counted reward terms its tools fire (weights in RewardWeights, counts kept by its
    implementations) and the EnvConfig fields only its tools read (setting one under
    another set is an error). Every set has `finish`: an episode must be able to end."""

    tools: tuple[str, ...]
    counted_terms: tuple[str, ...]
    summary: str
    settings: tuple[str, ...] = ()


TOOL_SETS: dict[str, ToolSetSpec] = {
    "free_form": ToolSetSpec(
        tools=("run_command", "read_file", "search", "edit_file", "apply_patch", "finish"),
        counted_terms=(),
        summary="free-form coding tools: run, read, search, edit, patch; reaches any bug",
    ),
    "fix_search": ToolSetSpec(
        tools=("list_fixes", "try_fix", "run_command", "finish"),
        counted_terms=("wasted_fix_try", "failed_fix_try"),
        settings=("max_fixes", "fix_test_timeout_s"),
        summary=(
            "choose among listed one-edit candidate fixes (components/env/fixes.py); for a "
            "small model that cannot copy code out of its context; reaches only listed fixes"
        ),
    ),
}
DEFAULT_TOOL_SET = "free_form"

_JSON_TYPES = {
    "string": str,
    "integer": int,
    "object": dict,
    "boolean": bool,
    "number": (int, float),
}


def tool_set_specs(name: str) -> dict[str, dict]:
    """{tool: spec} of the tool set `name`, in its prompt order."""
    if name not in TOOL_SETS:
        raise ValueError(f"unknown tool set {name!r} (known: {', '.join(TOOL_SETS)})")
    return {tool: TOOL_SPECS[tool] for tool in TOOL_SETS[name].tools}


def argument_errors(
    tool: str, arguments: object, specs: Mapping[str, dict] = TOOL_SPECS
) -> list[str]:
    """Return human-readable problems with a tool call; empty when the call is valid.
    `specs`: the tools that exist (default: every tool; an environment passes its set's)."""
    if tool not in specs:
        return [f"unknown tool {tool!r} (known: {', '.join(specs)})"]
    if not isinstance(arguments, dict):
        return [f"{tool}: arguments must be a JSON object, got {type(arguments).__name__}"]
    schema = specs[tool]["parameters"]
    errors = [f"{tool}: missing argument {k!r}" for k in schema["required"] if k not in arguments]
    for key, value in arguments.items():
        prop = schema["properties"].get(key)
        if prop is None:
            errors.append(f"{tool}: unexpected argument {key!r}")
            continue
        expected = _JSON_TYPES[prop["type"]]
        if isinstance(value, bool) and prop["type"] != "boolean" or not isinstance(value, expected):
            errors.append(f"{tool}: argument {key!r} must be {prop['type']}")
        elif "minimum" in prop and value < prop["minimum"]:
            errors.append(f"{tool}: argument {key!r} must be >= {prop['minimum']}")
    return errors
