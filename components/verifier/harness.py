"""The hidden-test harness: a stand-alone program the verifier ships into the sandbox.

It runs pytest on the hidden tests and the canary with the plugins given explicitly
(pytest-timeout, the CPU-time limit, and a recorder of what each test's setup, call and
teardown raised, independently of pytest's reports) and writes one
`AGENTRL-VERDICT <token> <json>` line last, to a copy of the original stdout taken before
any repository code runs. components/verifier/hidden_tests.py judges that record.

Usage: python harness.py TOKEN ROOT TIMEOUT_S PYTEST_ARGS..., with the sandbox's harness
plugins (agentrl_limits, agentrl_cpu_timeout) on PYTHONPATH. It imports nothing of agentrl.
"""

import json
import os
import sys

IMPORT_TIMEOUTS = []
ENDINGS = ("_pytest.outcomes.Exit", "SystemExit", "KeyboardInterrupt")


def on_limit(kind):
    IMPORT_TIMEOUTS.append(1)
    raise TimeoutError("import of a test module timed out")


def main():
    token, root, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    out = os.dup(1)
    sys.path.append(root)  # the repository, behind the environment's packages
    import agentrl_cpu_timeout
    import agentrl_limits
    import pytest
    import pytest_timeout

    record = {"items": [], "phases": {}, "reports": {}, "collect": []}

    def rel(path):
        return os.path.relpath(str(path), root)

    class Recorder:
        def _watch(self, item, phase):
            try:
                result = yield
            except BaseException as e:
                record["phases"].setdefault(item.nodeid, {})[phase] = type(e).__name__
                raise
            record["phases"].setdefault(item.nodeid, {})[phase] = "ok"
            return result

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_setup(self, item):
            return (yield from self._watch(item, "setup"))

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_call(self, item):
            return (yield from self._watch(item, "call"))

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_runtest_teardown(self, item):
            return (yield from self._watch(item, "teardown"))

        def pytest_runtest_logreport(self, report):
            record["reports"].setdefault(report.nodeid, {})[report.when] = report.outcome

        @pytest.hookimpl(wrapper=True, tryfirst=True)
        def pytest_make_collect_report(self, collector):
            # pytest-timeout covers tests, not the import of a test module (and of the code
            # it imports): a module that hangs at import fails here, under the limits a
            # test gets (CPU time, and wall time less the time starved of a core).
            try:
                agentrl_limits.arm(timeout, timeout, on_limit)
                return (yield)
            finally:
                agentrl_limits.cancel()

        def pytest_collectreport(self, report):
            if report.outcome != "passed":
                path = report.nodeid.split("::")[0]
                text = report.longreprtext
                ended = any(x in text for x in ENDINGS)  # the import ended the run
                outcome = "ended" if ended else report.outcome
                record["collect"].append([rel(self.rootpath / path), outcome])

        def pytest_configure(self, config):
            self.rootpath = config.rootpath

        def pytest_collection_finish(self, session):
            record["items"] = [[i.nodeid, rel(i.path)] for i in session.items]

    rc = pytest.main(sys.argv[4:], plugins=[pytest_timeout, agentrl_cpu_timeout, Recorder()])
    record["rc"] = int(rc)
    record["import_timeouts"] = len(IMPORT_TIMEOUTS)
    os.write(out, f"\nAGENTRL-VERDICT {token} {json.dumps(record)}\n".encode())


if __name__ == "__main__":
    main()
