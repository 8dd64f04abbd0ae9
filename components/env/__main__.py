"""CLI of the environment: `agentrl env isolation`, and the sandboxed task gate behind
`agentrl tasks check|import` (`agentrl env eval` and `agentrl demo` are evaluations:
components/evaluate/__main__.py)."""

from __future__ import annotations

import json

from components.cli_args import ArgumentParser, preset_file
from components.sandbox.config import SandboxConfig
from components.sandbox.isolation import isolation_report


def _sandboxed_runner(argv: list[str]):
    """(the gate's test runner, the converters' `run_python`, the gate's hang finder, its
    oracle replay, all under the preset's env and sandbox sections, the rest of argv)."""
    import dataclasses

    from components.preset import DEFAULT_PRESET, load_preset
    from components.sandbox.process import run_sandboxed
    from components.scripted.registry import oracle_replay
    from components.tasks.gate import hang_finder
    from components.verifier import sandboxed_test_runner

    p = ArgumentParser(add_help=False)
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file)
    args, rest = p.parse_known_args(argv)
    preset = load_preset(args.preset)
    env, sandbox = preset.section("env"), preset.section("sandbox")

    def run_python(folder, python_args: list[str], wall_s: float) -> tuple[int, str]:
        cfg = dataclasses.replace(
            sandbox, wall_time_s=wall_s, cpu_time_s=max(sandbox.cpu_time_s, int(wall_s) + 1)
        )
        result = run_sandboxed(["python", *python_args], folder, cfg)
        return result.exit_code, result.output

    find_hangs = hang_finder(run_python, env.per_test_timeout_s)
    replay = oracle_replay(env, sandbox)
    return sandboxed_test_runner(env, sandbox), run_python, find_hangs, replay, rest


def main_isolation(argv: list[str]) -> int:
    ArgumentParser(prog="agentrl env isolation").parse_args(argv)
    print(json.dumps(isolation_report(SandboxConfig()), indent=2, default=str))
    return 0


def main_tasks_check(argv: list[str]) -> int:
    """`agentrl tasks check [--preset P]`: the data gate, with hidden tests run by the
    sandboxed verifier under the preset's env and sandbox sections."""
    from components.tasks.__main__ import main_check

    run_tests, _, find_hangs, replay, rest = _sandboxed_runner(argv)
    return main_check(rest, run_tests=run_tests, find_hangs=find_hangs, replay=replay)


def main_tasks_import(argv: list[str]) -> int:
    """`agentrl tasks import [--preset P] [--from quixbugs] SRC --out DIR`: convert a
    benchmark or load a folder of tasks, gate them and copy the valid ones; benchmark and
    task code run only in the sandbox."""
    from components.preset import DEFAULT_PRESET, load_preset
    from components.tasks.__main__ import main_import

    run_tests, run_python, find_hangs, replay, rest = _sandboxed_runner(argv)
    p = ArgumentParser(add_help=False)
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file)
    sandbox = load_preset(p.parse_known_args(argv)[0].preset).section("sandbox")
    return main_import(rest, run_tests=run_tests, run_python=run_python, find_hangs=find_hangs,
                       replay=replay, sandbox=sandbox)  # fmt: skip
