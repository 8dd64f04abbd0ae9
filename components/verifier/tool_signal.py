"""The task's own verifier as the test signal of the episode's tools, where the task's test
command finds no tests (issue 46).

A Harbor task's tests live only in its verifier (hidden_tests/.harbor-tests, run by its
test.sh; components/tasks/harbor.py), so its test command, `python -m pytest -q` in the
agent's repository, collects nothing and exits 5: fix_search's `list_fixes` and `try_fix`
would read every candidate, the right one too, as FAILED. When the command found no tests
(`found_no_tests`: pytest's exit status 5 and its "no tests ran" line, no limit hit), the
tools get the verifier's verdict on the workspace as it stands instead (`verifier_signal`):
PASSED or FAILED, in one line that says where it came from. Only the verdict: nothing of the
hidden tests' text or their output (the expected values) reaches the agent, and it is the
same verdict the episode's end would give that tree (the verifier's cache keeps it, so the
final verification of an unchanged tree costs nothing more). A verifier that gives no
verdict (an infrastructure error) is said in words, and the try reads as not passed.
"""

from __future__ import annotations

import dataclasses

from components.sandbox.process import CommandResult

NO_TESTS_COLLECTED = 5  # pytest's exit status when it collected no test


def found_no_tests(cmd: CommandResult) -> bool:
    """Did the test command run to its end and find no test to run?"""
    return (
        cmd.exit_code == NO_TESTS_COLLECTED
        and cmd.limit_hit is None
        and "no tests ran" in cmd.output
    )


def verifier_signal(ctx, cmd: CommandResult) -> CommandResult:
    """`cmd` (the tools' run of the task's test command in `ctx`, a ToolContext), or, when
    it found no tests, the task's verifier's verdict on `ctx.workspace` as a command
    result: exit 0 for PASSED, 1 for FAILED, one line of output."""
    from components.verifier.verdict import verify

    task = ctx.task
    if not found_no_tests(cmd):
        return cmd
    shown = " ".join(task.test_command)
    v = verify(task, ctx.workspace.root, ctx.env, ctx.sandbox)
    if v.status != "ok":
        line = (f"`{shown}` found no tests, and the task's verifier gave no verdict "
                "(an infrastructure error, not this tree's): tests not run")  # fmt: skip
        return dataclasses.replace(cmd, output=line + "\n")
    verdict = "PASSED" if v.tests_passed else "FAILED"
    line = f"`{shown}` found no tests; the task's own verifier: tests {verdict}"
    return dataclasses.replace(cmd, exit_code=0 if v.tests_passed else 1, output=line + "\n")
