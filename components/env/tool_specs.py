"""The environment's tool registry: names, argument schemas, and an argument checker.

This is the contract shared by the sandbox (which executes tools), the data layer (which
validates logged trajectories) and the policy (whose chat template lists the tools).
Schemas follow the OpenAI function-calling shape so they can be handed to any chat model.

Each description says what the tool returns, and nothing it does not:
tests/env/test_tool_descriptions.py runs every tool in an episode and checks the claims.
"""

from __future__ import annotations

from components.env.sandbox import DEFAULT_ALLOWED_PROGRAMS

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

_JSON_TYPES = {
    "string": str,
    "integer": int,
    "object": dict,
    "boolean": bool,
    "number": (int, float),
}


def argument_errors(tool: str, arguments: object) -> list[str]:
    """Return human-readable problems with a tool call; empty when the call is valid."""
    if tool not in TOOL_SPECS:
        return [f"unknown tool {tool!r} (known: {', '.join(TOOL_NAMES)})"]
    if not isinstance(arguments, dict):
        return [f"{tool}: arguments must be a JSON object, got {type(arguments).__name__}"]
    schema = TOOL_SPECS[tool]["parameters"]
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
