"""agentrl_limits calls `on_hit` at most once per arm() and never after cancel().

A signal whose Python handler runs after the caller has left its `try` (the kernel
delivered it just before cancel(), or the other limit's signal was pending while the first
handler raised) used to raise in the caller's `except`/`finally`: the gate's hang scan then
lost its whole result under load."""

import importlib.util
import signal
from pathlib import Path

import pytest

PLUGIN = Path(__file__).parents[2] / "components/sandbox/harness_plugins/agentrl_limits.py"


@pytest.fixture
def limits():
    spec = importlib.util.spec_from_file_location("agentrl_limits_under_test", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    saved = signal.getsignal(signal.SIGPROF), signal.getsignal(signal.SIGALRM)
    yield module
    module.cancel()
    signal.signal(signal.SIGPROF, saved[0])
    signal.signal(signal.SIGALRM, saved[1])


class Hit(Exception):
    pass


def test_a_signal_handled_after_cancel_does_not_call_on_hit(limits):
    hits = []
    limits.arm(60, 60, hits.append)
    limits.cancel()
    signal.raise_signal(signal.SIGPROF)
    signal.raise_signal(signal.SIGALRM)
    assert hits == []


def test_the_second_limit_pending_after_the_first_hit_is_ignored(limits):
    hits = []

    def on_hit(kind):
        hits.append(kind)
        raise Hit

    limits.arm(60, 0.001, on_hit)
    with pytest.raises(Hit):
        signal.raise_signal(signal.SIGPROF)
    signal.raise_signal(signal.SIGALRM)  # as if it had been pending: no second raise
    assert hits == ["cpu"]


def test_a_new_arm_hits_again(limits):
    hits = []

    def on_hit(kind):
        hits.append(kind)
        raise Hit

    for _ in range(2):
        limits.arm(60, 60, on_hit)
        with pytest.raises(Hit):
            signal.raise_signal(signal.SIGPROF)
    assert hits == ["cpu", "cpu"]
