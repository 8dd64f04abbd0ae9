"""The types every tool set is made of: a tool (schema, implementation, safety rule), the
episode context its implementation gets, its result, a set, a decoding constraint, and the
argument checker every call goes through."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.env.rubric import Term
from components.env.safety import Rule, SafetyVerdict
from components.sandbox.config import SandboxConfig
from components.sandbox.output import cap_text
from components.sandbox.process import CommandResult
from components.sandbox.workspace import Workspace
from components.tasks.task import Task

# Room kept after a command's (already capped) output for the status lines.
STATUS_RESERVE = 160


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


def tool_result(
    config: SandboxConfig,
    text: str,
    *,
    ok: bool = True,
    error: str | None = None,
    command: CommandResult | None = None,
    truncated: bool = False,
) -> ToolResult:
    """A result whose observation is `text` capped at the sandbox's output limit."""
    capped, cut = cap_text(text, config.max_output_bytes)
    return ToolResult(capped, ok, truncated or cut, error, None, command)


def failed_result(
    config: SandboxConfig, text: str, error: str, *, safety: SafetyVerdict | None = None
) -> ToolResult:
    capped, cut = cap_text(text, config.max_output_bytes)
    return ToolResult(capped, False, cut, error, safety, None)


@dataclass
class ToolContext:
    """What a tool implementation may use in one episode."""

    workspace: Workspace
    sandbox: SandboxConfig  # the agent's sandbox (the task folder hidden)
    task: Task
    env: Any  # the episode's EnvConfig (components/env/config.py, which reads the sets)
    state: Any  # the tool set's own per-episode state (`ToolSet.new_state()`)
    counts: Counter[str] = field(default_factory=Counter)  # the set's counted reward terms


@dataclass(frozen=True)
class Tool:
    """One tool: its OpenAI-style schema (`description`, `parameters`; the description says
    what it returns and nothing else), its implementation, and its safety rule (what of a
    call the monitor judges, components/env/safety.py; None: nothing). `demo`: a request and
    the call answering it, for a text_tools prompt's demonstrated turn; `ends_episode`: a
    call of it (valid or not) ends the episode."""

    name: str
    schema: dict
    run: Callable[[ToolContext, dict], ToolResult]
    monitor: Rule | None = None
    demo: tuple[str, dict] | None = None
    ends_episode: bool = False


@dataclass(frozen=True)
class DecodingConstraint:
    """A mask on what a model may sample, per episode ("row").

    `live(state)`: this episode's constraint from the set's state (None: no mask this turn);
    `from_events(events)`: the same read back from a transcript, for a policy that sees only
    events; `logits_processor(tokenizer, prompt_width, rows)`: a transformers
    LogitsProcessor masking each row by its constraint. The sampled log-probs stay the
    model's own (components/env/tool_sets/fix_search/constrain.py says why)."""

    summary: str
    live: Callable[[Any], Any]
    from_events: Callable[[Sequence[dict]], Any]
    logits_processor: Callable[[Any, int, Sequence[Any]], Any]


@dataclass(frozen=True)
class ToolSet:
    """An environment's action space: its tools in the order the system prompt lists them
    (every set has one that ends the episode), its own reward terms (`rubric`, beside the
    common ones; weights in RewardWeights under the terms' names), the EnvConfig fields
    only its tools read (`settings`: setting one under another set is an error), its
    per-episode state and, optionally, a decoding constraint."""

    name: str
    tools: Mapping[str, Tool]
    summary: str
    rubric: tuple[Term, ...] = ()
    settings: tuple[str, ...] = ()
    new_state: Callable[[], Any] = lambda: None
    constraint: DecodingConstraint | None = None

    @property
    def specs(self) -> dict[str, dict]:
        """{tool: OpenAI-style spec}, in prompt order."""
        return {name: tool.schema for name, tool in self.tools.items()}

    @property
    def counted_terms(self) -> tuple[str, ...]:
        return tuple(term.name for term in self.rubric)

    def ends_episode(self, name: str | None) -> bool:
        """Whether a call of `name` (valid or not) ends the episode."""
        tool = self.tools.get(name) if name is not None else None
        return tool is not None and tool.ends_episode


def tools_of(*tools: Tool) -> dict[str, Tool]:
    """{name: tool} in the given (prompt) order."""
    return {tool.name: tool for tool in tools}


_JSON_TYPES = {
    "string": str,
    "integer": int,
    "object": dict,
    "boolean": bool,
    "number": (int, float),
}


def argument_errors(tool: str, arguments: object, specs: Mapping[str, dict]) -> list[str]:
    """Return human-readable problems with a tool call; empty when the call is valid.
    `specs`: the tools that exist (components.env.tool_sets.argument_errors defaults it to
    every tool of every set; an environment passes its set's)."""
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
