"""pytest-timeout's per-test limit counted in CPU time, so a verdict does not depend on load.

Loaded into every sandboxed pytest run (components/sandbox/environ.py: sandbox_env puts this
folder on PYTHONPATH and names the module in PYTEST_PLUGINS), next to pytest-timeout, whose
options, ini keys and markers stay the interface: `--timeout=N` is now N seconds of the
test process's CPU time, and N seconds of wall time less the time it was starved of a core
(agentrl_limits.py). A loop burns CPU time on every machine and is stopped as before
("Failed: Timeout (>Ns of CPU time)"); a busy machine adds neither, so it fails no test.

A test stopped for waiting (a sleep, a blocking read) is not judged at once: it is re-run,
with its wait limit doubled each time, up to RERUNS times, in case what it waited on was
the machine (a disk, a page-in); only a test that waits past its limit on every run fails
("Failed: Timeout (>Ns waiting, under Ns of CPU time)"). Only the last run's reports are
logged, so a re-run reads like a run that was never slow.

Stand-alone on purpose (stdlib + pytest + pytest-timeout): it runs under every task
environment's interpreter, which has only the harness's distributions. The
`--timeout-method` option and the `func_only` setting are ignored: the limit covers setup,
call and teardown, as pytest-timeout's default does. Not protected: code under test runs in
this process and can re-arm or ignore the timers (the sandbox's own CPU and wall limits
still end the process; that costs the code its verdict, components/verifier/verdict.py).
"""

import agentrl_limits
import pytest
from _pytest.runner import call_and_report, show_test_item  # pytest's own runner's steps
from pytest_timeout import _get_item_settings

RERUNS = 2  # re-runs of a test stopped for waiting before it is judged
WAITED = []  # node ids of the tests stopped for waiting, once per run, in order


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    return True  # armed per run in pytest_runtest_protocol below, not by pytest-timeout


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item):
    agentrl_limits.cancel()
    return True


def _arm(cpu_s, own_s):
    state = {"hit": None}

    def on_hit(kind):
        __tracebackhide__ = True
        state["hit"] = kind
        if kind == "cpu":
            pytest.fail(f"Timeout (>{cpu_s:g}s of CPU time)")
        pytest.fail(f"Timeout (>{own_s:g}s waiting, under {cpu_s:g}s of CPU time)")

    agentrl_limits.arm(cpu_s, own_s, on_hit)
    return state


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    settings = _get_item_settings(item)
    if not settings.timeout or settings.timeout <= 0:
        return None  # no limit: pytest's own protocol
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for attempt in range(RERUNS + 1):
        if item.config.getoption("setupshow", False):
            show_test_item(item)
        if getattr(item, "_request", True) is False:
            item._initrequest()  # a re-run, as pytest-rerunfailures does
        state = _arm(settings.timeout, settings.timeout * 2**attempt)
        try:
            reports = [call_and_report(item, "setup", log=False)]
            if reports[0].passed:
                reports.append(call_and_report(item, "call", log=False))
            # Before a re-run only the test's own fixtures go; otherwise teardown as usual.
            rerun = state["hit"] == "wait" and attempt < RERUNS and not item.session.shouldfail
            reports.append(
                call_and_report(
                    item, "teardown", log=False, nextitem=item.parent if rerun else nextitem
                )
            )
        finally:
            agentrl_limits.cancel()
            if hasattr(item, "_request"):
                item._request = False
                item.funcargs = None
        if state["hit"] != "wait":
            break
        WAITED.append(item.nodeid)
        if not rerun:
            break
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
