"""The policy sync's log-prob probe against a fake OpenAI-compatible server on loopback
(fake_openai.py): a server that loads the version passes, within the tolerance of another
dtype; one that answers the load request but keeps its old weights (and even lists the new
name) stops the run with an error naming the version and the server.
"""

from __future__ import annotations

import math

import pytest

from components.env.config import EnvConfig
from components.rollout.config import RolloutConfig
from components.rollout.policy_sync import PolicySync, PolicySyncError, Probe, separation
from components.sandbox.config import SandboxConfig
from components.train.async_rollouts import ServedSampler
from components.train.checkpoints import version_dir
from components.train.task_stream import TaskStream
from tests.rollout.fake_openai import FakeServer, fake_server

PROMPT = [5, 6, 7]


def log_softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    total = math.log(sum(math.exp(x - top) for x in logits)) + top
    return [x - total for x in logits]


V0 = log_softmax([2.0, 1.0, 0.5, 0.0, -1.0, -2.0, 0.2, 0.1])
V1 = log_softmax([1.0, 2.0, 0.5, 0.3, -1.0, -2.0, 0.2, 0.1])  # one update later


def write_version(output_dir, version: int, logprobs: list[float]):
    folder = version_dir(output_dir, version)
    folder.mkdir(parents=True)
    Probe(PROMPT, logprobs).write(folder)
    return folder


def sampler(url: str, output_dir) -> ServedSampler:
    config = RolloutConfig(backend="openai", base_url=url, sync_retries=0, sync_timeout_s=10)
    return ServedSampler(
        stream=TaskStream([], 0, 1), tokenizer=None, rollout_config=config,
        env_config=EnvConfig(), sandbox_config=SandboxConfig(), output_dir=output_dir,
        prefix="run", lora=True, probe_tolerance=0.1,
    )  # fmt: skip


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_a_server_that_loads_each_version_passes(tmp_path, noise):
    """Versions 0 then 1 loaded: each checked against its own probe (0.03 nats off: a
    server in another dtype), the previous adapter unloaded."""
    with fake_server(FakeServer(V0, noise=noise)) as url:
        served = sampler(url, tmp_path)
        write_version(tmp_path, 0, V0)
        write_version(tmp_path, 1, V1)
        served._serve("run-v0", 0)
        served._serve("run-v1", 1)
        assert served.loaded == 1 and served.probe.logprobs == pytest.approx(V1, abs=1e-6)
        assert PolicySync(url, "lora").served() == ["base", "run-v1"]
        distance = PolicySync(url, "lora").verify("run-v1", Probe(PROMPT, V1), 0.1)
        assert distance == pytest.approx(noise, abs=1e-5)


def test_a_server_that_ignores_the_load_is_caught(tmp_path):
    """The fake answers 200 and lists run-v1 but still serves version 0's weights: the
    name check passes, the probe does not, and the error says which version it is nearer."""
    with fake_server(FakeServer(V0, ignore_loads=True)) as url:
        served = sampler(url, tmp_path)
        write_version(tmp_path, 0, V0)
        write_version(tmp_path, 1, V1)
        served._serve("run-v0", 0)  # serving the base is serving version 0: it passes
        with pytest.raises(PolicySyncError) as info:
            served._serve("run-v1", 1)
        assert "run-v1" in PolicySync(url, "lora").served()  # the name alone would pass
    message = str(info.value)
    assert message.startswith(f"policy sync: the server at {url} still serves other weights "
                              "than run-v1 after loading it")  # fmt: skip
    assert "nearer the previous version's" in message and "\n" not in message
    assert served.loaded == 0  # nothing samples under the unverified version


def test_the_tolerance_separates_the_versions():
    """On the server's top tokens the two versions are more than twice the tolerance apart:
    a server within it of version 1 is nearer version 1 than version 0 (the docstring's
    triangle-inequality argument)."""
    top = sorted(range(len(V1)), key=lambda t: -V1[t])[:5]
    assert separation(Probe(PROMPT, V1), Probe(PROMPT, V0), top) > 2 * 0.1


def test_a_server_without_logprobs_is_an_error(tmp_path):
    no_logprobs = pytest.raises(PolicySyncError, match="gave no log-probs for the probe of missing")
    with fake_server(FakeServer(V0)) as url, no_logprobs:
        PolicySync(url, "lora").verify("missing", Probe(PROMPT, V0), 0.1)


def test_a_probe_round_trips_through_its_folder(tmp_path):
    assert Probe.read(tmp_path) is None
    Probe(PROMPT, V0).write(tmp_path)
    probe = Probe.read(tmp_path)
    assert probe.prompt_ids == PROMPT and probe.logprobs == pytest.approx(V0, abs=1e-6)
    assert probe.distance({99: -1.0}) == math.inf  # a token outside its vocabulary
