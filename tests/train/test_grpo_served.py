"""GRPO sampling on `agentrl serve` (the real command line, loopback) with a policy sync
after each update: versions recorded per episode, the server equal to the trainer after a
sync, a failed sync that stops the run, and asynchronous rollouts (staleness 0 is the
synchronous run; resume stays exact).

The runs are tiny (2 tasks, G = 2, 16-token turns, one step per episode). The untrained
model's episodes mostly get equal rewards (zero advantages), so the weights are made to
move every update with weight decay: whatever the advantages, version v + 1 differs from
version v, and a server left on an old version would show.
"""

from __future__ import annotations

import pytest
import torch

from components.env.config import EnvConfig
from components.policy.chat import prompt_ids
from components.rollout.config import RolloutConfig
from components.rollout.engine import generate_transformers
from components.rollout.openai_backend import OpenAICompletionsClient
from components.rollout.policy_sync import PolicySync, PolicySyncError, version_number
from components.sandbox.config import SandboxConfig
from components.train import grpo
from components.train.checkpoints import version_dir
from components.train.config import GRPOConfig
from tests.serve.served import running_server

ENV = EnvConfig(max_steps=1)
TIMING = {"sample_seconds", "update_seconds", "iteration_seconds", "tokens_per_s",
          "sample_tokens_per_s", "rollout_wait_seconds"}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, tokenizer_dir):
    from components.policy.config import PolicyConfig
    from components.policy.model import build_policy, save_policy
    from tests.train.conftest import TINY

    model, tokenizer = build_policy(PolicyConfig(**TINY, tokenizer_path=str(tokenizer_dir)))
    return save_policy(model, tokenizer, tmp_path_factory.mktemp("served_start"))


@pytest.fixture(scope="module")
def server(checkpoint):
    with running_server(checkpoint) as url:
        yield url


def rollout_config(url: str, sync_retries: int = 0) -> RolloutConfig:
    return RolloutConfig(
        backend="openai", base_url=url, max_new_tokens=16, max_episode_tokens=1024,
        batch_size=4, workers=2, temperature=1.0, sync_retries=sync_retries,
    )  # fmt: skip


def run(checkpoint, url, tasks, out, iterations, sync_retries=0, **overrides):
    """A served GRPO run from the checkpoint; returns (result, the trained model, tokenizer)."""
    from components.policy.model import load_policy

    model, tokenizer = load_policy(checkpoint)
    settings = dict(iterations=iterations, tasks_per_iteration=2, group_size=2,
                    learning_rate=0.05, weight_decay=1.0, micro_batch_size=2,
                    output_dir=str(out))  # fmt: skip
    config = GRPOConfig(**{**settings, **overrides})
    result = grpo.train_grpo(model, tokenizer, tasks, config,
                             rollout_config(url, sync_retries), ENV, SandboxConfig())  # fmt: skip
    return result, model, tokenizer


def strip(rows):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def assert_same_metrics(rows, others):
    """The same episodes, rewards and updates. The server batches the requests that arrive
    together, so its log-probs (the PPO ratio's old side) may differ by an ulp of float32
    with the arrival order; the sampled tokens do not (one seeded stream per row)."""
    rows, others = strip(rows), strip(others)
    assert [sorted(r) for r in rows] == [sorted(r) for r in others]
    for row, other in zip(rows, others, strict=True):
        assert row == pytest.approx(other, rel=1e-6, abs=1e-7)


def test_served_run_records_versions_and_the_server_matches_after_sync(
    checkpoint, server, suite, tmp_path, monkeypatch
):
    """Two synchronous iterations: iteration i's episodes are sampled by version i - 1 on
    the server; after syncing the final version, the server's greedy output equals the
    trained model's own (and differs from the starting version's)."""
    _, tasks = suite
    seen = {}
    real = grpo.recipe.drop_stale

    def record(rollouts, iteration, lag):
        seen[iteration] = {r.policy_version for r in rollouts}
        assert all(len(set(r.policy_versions)) == 1 for r in rollouts)
        return real(rollouts, iteration, lag)

    monkeypatch.setattr(grpo.recipe, "drop_stale", record)
    result, model, tokenizer = run(checkpoint, server, tasks, tmp_path, 2)
    assert {i: {version_number(v) for v in names} for i, names in seen.items()} == {1: {0}, 2: {1}}
    assert all(r["policy_lag"] == 0 and r["stale_dropped"] == 0 for r in result.metrics)
    (name,) = seen[2]
    final = name.replace("-v1", "-v2")
    PolicySync(server, "full", retries=0).sync(final, version_dir(tmp_path, 2))
    ids = prompt_ids(tokenizer, [{"role": "user", "content": "Fix the failing test."}])
    client = OpenAICompletionsClient(server, final, timeout_s=30, max_retries=0)
    served = client.complete(ids, 12, temperature=0.0, top_p=1.0, seed=0)
    (local,) = generate_transformers(model, tokenizer, [ids], [12], temperature=0.0, top_p=1.0,
                                     seed=0)  # fmt: skip
    assert not served.error and served.policy_version == final
    assert served.token_ids == local.token_ids
    assert max(abs(a - b) for a, b in zip(served.logprobs, local.logprobs, strict=True)) < 1e-4
    # The weights moved: the starting policy's log-probs are not the trained one's.
    from components.policy.model import load_policy

    start, _ = load_policy(checkpoint)
    (old,) = generate_transformers(start, tokenizer, [ids], [12], temperature=0.0, top_p=1.0,
                                   seed=0)  # fmt: skip
    assert max(abs(a - b) for a, b in zip(old.logprobs, local.logprobs, strict=False)) > 1e-3


def test_staleness_zero_is_the_synchronous_run(checkpoint, server, suite, tmp_path):
    """async_rollouts with max_staleness 0 (the rollout thread, never ahead) ends with the
    synchronous run's weights and metrics, bit for bit."""
    _, tasks = suite
    sync_result, sync_model, _ = run(checkpoint, server, tasks, tmp_path / "sync", 2)
    async_result, async_model, _ = run(checkpoint, server, tasks, tmp_path / "async", 2,
                                       async_rollouts=True, max_staleness=0)  # fmt: skip
    for (name, a), (_, b) in zip(sync_model.state_dict().items(),
                                 async_model.state_dict().items(), strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    assert_same_metrics(sync_result.metrics, async_result.metrics)


def test_a_failed_sync_stops_the_run_with_one_line(checkpoint, server, suite, tmp_path,
                                                   monkeypatch):  # fmt: skip
    """A version the server cannot load (its folder holds no weights: a write that went
    wrong): the server keeps what it served, the sync is retried, then the run stops with a
    one-line PolicySyncError."""
    from components.train import checkpoints

    _, tasks = suite
    before = PolicySync(server, "full").served()

    def broken(stepper, output_dir, version, probe_ids=None):
        folder = checkpoints.version_dir(output_dir, version)
        folder.mkdir(parents=True)
        return folder

    monkeypatch.setattr(grpo.recipe, "save_version", broken)
    with pytest.raises(PolicySyncError) as info:
        run(checkpoint, server, tasks, tmp_path, 1, sync_retries=2, async_rollouts=True)
    message = str(info.value)
    assert "\n" not in message and "in 3 tries" in message and "HTTP 400" in message
    assert PolicySync(server, "full").served() == before


def test_async_staleness_one_resumes_exactly(checkpoint, server, suite, tmp_path):
    """max_staleness 1: iteration i is sampled by version i - 2 (lag 1 from iteration 2 on);
    3 iterations straight end where 2, then a fresh process resumed to 3, ends."""
    _, tasks = suite
    straight, model, _ = run(checkpoint, server, tasks, tmp_path / "straight", 3,
                             async_rollouts=True)  # fmt: skip
    assert [r["policy_lag"] for r in straight.metrics] == [0, 1, 1]
    run(checkpoint, server, tasks, tmp_path / "killed", 2, async_rollouts=True)
    resumed, fresh, _ = run(checkpoint, server, tasks, tmp_path / "killed", 3,
                            async_rollouts=True)  # fmt: skip
    assert resumed.resumed_from == 2
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items(),
                                 strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    assert_same_metrics(straight.metrics[2:], resumed.metrics)


def test_dynamic_sampling_on_the_server_sync_and_ahead(checkpoint, server, suite, tmp_path):
    """Dynamic sampling with served sampling, synchronous and in the rollout process
    (s = 0): the same rounds, episodes and weights. Every version carries its probe, which
    the sampler checked against the server after each sync (a mismatch would stop the run)."""
    _, tasks = suite
    dynamic = dict(tasks_per_iteration=1, dynamic_sampling=True, max_resample_rounds=1)
    sync_result, sync_model, _ = run(checkpoint, server, tasks, tmp_path / "sync", 2,
                                     **dynamic)  # fmt: skip
    async_result, async_model, _ = run(checkpoint, server, tasks, tmp_path / "async", 2,
                                       async_rollouts=True, max_staleness=0, **dynamic)  # fmt: skip
    for (name, a), (_, b) in zip(sync_model.state_dict().items(),
                                 async_model.state_dict().items(), strict=True):  # fmt: skip
        assert torch.equal(a, b), name
    assert_same_metrics(sync_result.metrics, async_result.metrics)
    for row in sync_result.metrics:
        assert row["groups_sampled"] == 1 + row["resample_rounds"]
        assert row["episodes"] == 2 * (row["groups_sampled"] - row["groups_zero_variance"])
    assert (version_dir(tmp_path / "sync", 2) / "probe.json").is_file()


def test_async_needs_a_server(tiny_policy, suite, tmp_path):
    model, tokenizer = tiny_policy
    config = GRPOConfig(iterations=1, async_rollouts=True, output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="rollout.backend"):
        grpo.train_grpo(model, tokenizer, suite[1], config, RolloutConfig(), ENV,
                        SandboxConfig())  # fmt: skip
    with pytest.raises(ValueError):
        GRPOConfig(max_staleness=-1)


@pytest.mark.slow  # its own server (a LoRA run needs the untouched base): ~30 s
def test_lora_run_loads_each_version_as_an_adapter(checkpoint, suite, tmp_path):
    """LoRA, asynchronous (s = 1): each version is an adapter named by version, loaded when
    needed and unloaded when the next one is; the final one, loaded, answers like the
    trained model in-process."""
    from components.policy.config import LoRAConfig

    _, tasks = suite
    with running_server(checkpoint) as url:
        result, model, tokenizer = run(checkpoint, url, tasks, tmp_path, 3, async_rollouts=True,
                                       lora=LoRAConfig(r=4, alpha=8))  # fmt: skip
        assert [r["policy_lag"] for r in result.metrics] == [0, 1, 1]
        sync = PolicySync(url, "lora", retries=0)
        (adapter,) = [n for n in sync.served() if n != "policy"]
        assert version_number(adapter) == 1  # iteration 3 sampled by version 1; 0 unloaded
        final = adapter.replace("-v1", "-v3")
        sync.sync(final, version_dir(tmp_path, 3))
        ids = prompt_ids(tokenizer, [{"role": "user", "content": "Fix the failing test."}])
        served = OpenAICompletionsClient(url, final, timeout_s=30).complete(
            ids, 12, temperature=0.0, top_p=1.0, seed=0
        )
        model.eval()
        (local,) = generate_transformers(model, tokenizer, [ids], [12], temperature=0.0,
                                         top_p=1.0, seed=0)  # fmt: skip
        assert served.token_ids == local.token_ids and served.policy_version == final


def test_cli_samples_on_the_server_from_the_preset(checkpoint, server, suite, tmp_path, capsys):
    """`agentrl train grpo` with a preset whose rollout section names the server: the run
    samples there (asynchronously) and its metrics carry the versions' lag."""
    import json

    import yaml

    root, _ = suite
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({
        "grpo": {"iterations": 2, "group_size": 2, "tasks_per_iteration": 1,
                 "learning_rate": 0.0001, "async_rollouts": True, "max_staleness": 1},
        "rollout": {"backend": "openai", "base_url": server, "max_new_tokens": 8,
                    "workers": 1, "sync_retries": 0},
        "env": {"max_steps": 1},
    }))  # fmt: skip
    code = grpo.main_grpo(["--preset", str(preset), "--policy", str(checkpoint), "--tasks",
                           str(root), "--out", str(tmp_path / "run")])  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["iterations"] == 2 and out["last"]["policy_lag"] == 1


def test_stale_episodes_can_train_with_a_truncated_importance_ratio(checkpoint, server, suite,
                                                                     tmp_path):  # fmt: skip
    """stale_importance_cap > 0: the lagging episodes (iterations 2 and 3 at s = 1) take
    their PPO ratio against the pre-update weights (so it starts at 1), not against the
    older version that sampled them (which the weight decay moved away from)."""
    _, tasks = suite
    plain, _, _ = run(checkpoint, server, tasks, tmp_path / "plain", 3, async_rollouts=True)
    decoupled, _, _ = run(checkpoint, server, tasks, tmp_path / "decoupled", 3,
                          async_rollouts=True, stale_importance_cap=2.0)  # fmt: skip
    assert [r.get("decoupled_episodes", 0) for r in decoupled.metrics] == [0, 4, 4]
    # No lag: the same (up to the float noise of the server's batching, assert_same_metrics).
    assert plain.metrics[0]["ratio"] == pytest.approx(decoupled.metrics[0]["ratio"], abs=1e-6)
    for a, b in zip(plain.metrics[1:], decoupled.metrics[1:], strict=True):
        assert abs(b["ratio"] - 1.0) < 1e-4 < abs(a["ratio"] - 1.0)


def test_cli_stops_with_one_line_when_no_server_takes_the_policy(checkpoint, suite, tmp_path):
    import yaml

    from tests.serve.served import free_port

    root, _ = suite
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({
        "grpo": {"iterations": 1, "group_size": 2, "tasks_per_iteration": 1},
        "rollout": {"backend": "openai", "base_url": f"http://127.0.0.1:{free_port()}/v1",
                    "sync_retries": 1, "sync_timeout_s": 5},
    }))  # fmt: skip
    with pytest.raises(SystemExit) as info:
        grpo.main_grpo(["--preset", str(preset), "--policy", str(checkpoint), "--tasks",
                        str(root), "--out", str(tmp_path / "run")])  # fmt: skip
    message = str(info.value.code)
    assert message.startswith("agentrl train grpo: policy sync failed") and "\n" not in message
    assert "in 2 tries" in message


@pytest.mark.slow  # two torchrun ranks (gloo) of the real command line: ~1 min
def test_two_ranks_sample_on_the_server_through_rank_zero(checkpoint, server, suite, tmp_path):
    """Under torchrun only rank 0 samples and syncs; both ranks train on its episodes and
    the run ends like a one-process run of the same preset (same episodes, same metrics)."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    from tests.serve.served import REPO

    root, _ = suite
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({
        "grpo": {"iterations": 2, "group_size": 2, "tasks_per_iteration": 2,
                 "learning_rate": 0.0001, "async_rollouts": True, "max_staleness": 1,
                 "micro_batch_size": 1},
        "rollout": {"backend": "openai", "base_url": server, "max_new_tokens": 8,
                    "workers": 1, "sync_retries": 0},
        "env": {"max_steps": 1},
    }))  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "AGENTRL_USE_CPU": "1"}
    outs = {}
    for ranks in (1, 2):
        out = tmp_path / f"ranks{ranks}"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={ranks}", "-m", "components.cli", "train", "grpo",
                   "--preset", str(preset), "--policy", str(checkpoint), "--tasks", str(root),
                   "--out", str(out)]  # fmt: skip
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        outs[ranks] = json.loads((out / "result.json").read_text())["last"]
    assert outs[2]["policy_lag"] == 1 and outs[2]["episodes"] == 4
    for key in ("episodes", "mean_reward", "generated_tokens", "update_tokens", "policy_lag"):
        assert outs[1][key] == outs[2][key], key


def test_rollout_sample_stage_samples_on_the_server(checkpoint, server, suite, tmp_path):
    """`agentrl rollout sample` (the RS / DPO sampling stage) with a served backend: the
    server is made to serve the policy by its folder's name, and every episode says so."""
    import json

    import yaml

    from components.rollout.__main__ import main_sample

    root, _ = suite
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({
        "rollout": {"backend": "openai", "base_url": server, "max_new_tokens": 8,
                    "workers": 1, "sync_retries": 0, "samples_per_task": 2},
        "env": {"max_steps": 1},
    }))  # fmt: skip
    code = main_sample(["--preset", str(preset), "--policy", str(checkpoint), "--tasks",
                        str(root), "--limit", "1", "--out", str(tmp_path / "s")])  # fmt: skip
    assert code == 0
    records = [json.loads(x) for x in (tmp_path / "s" / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 2
    assert {r["metadata"]["model_version"] for r in records} == {checkpoint.name}
    names = OpenAICompletionsClient(base_url=server, model="").models()
    assert checkpoint.name in names
