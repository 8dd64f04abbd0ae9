"""The default (free-form) tool set end to end, in every run of the default suite (issue 23).

A scripted policy acts only through the free-form tools and only on what it reads: it runs
the tests, takes the failing function from the assertion in the test output, searches for
its definition, reads the file and edits it (or applies a patch), reruns the tests and
finishes. It writes its calls as tokens, like a model, through the same path a model's
episodes take: the rollout engine (`sample_episodes` with a `generate_fn`), the sandbox and
the verifier, the GRPO batch builder and update (`train_grpo`), and the evaluation metrics.
Its log-probs are the tiny model's own for the scripted ids (one forward pass), so the
first GRPO ratio is 1. What it knows that a model would not: the fixed text of the module
(the reference fix), as the oracle does; which module and which lines it learns by reading.

Sample k of a group: 0 edits with edit_file, 1 applies the reference patch, 2 gives up, so
a group's rewards differ. Episodes run one at a time (batch_size 1) so k is the order in
which a task's episodes start.
"""

from __future__ import annotations

import re
import shlex

import pytest
import torch

from components.env.config import EnvConfig
from components.env.episode import initial_message
from components.env.rewards import reward_terms
from components.env.tool_sets import TOOL_SETS, TOOL_SPECS
from components.evaluate.metrics import aggregate
from components.policy.chat import IM_END, format_tool_call
from components.rollout.completion import Completion
from components.rollout.config import RolloutConfig
from components.rollout.engine import sample_episodes
from components.sandbox.config import SandboxConfig
from components.scripted.reference import fixed_files, minimal_edits
from components.train.config import GRPOConfig
from components.train.grpo import collate_rollouts, per_token, rollout_rewards, train_grpo
from components.train.losses import group_advantages, token_logprobs

FREE_FORM = TOOL_SETS["free_form"].tools
K = 3
ROLLOUT = RolloutConfig(max_new_tokens=400, max_episode_tokens=2048, batch_size=1,
                        samples_per_task=K, workers=1, temperature=1.0)  # fmt: skip
ENV = EnvConfig(max_steps=8)  # the default tool set: free_form
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
_FAILING_CALL = re.compile(r"^>\s+assert\s+(?:not\s+)?(\w+)\(", re.MULTILINE)
_NUMBERED = re.compile(r"^\s*\d+\| ?(.*)$")


def _next_call(task, k: int, observations: list[str]) -> str:
    """The scripted policy: sample k's next tool call, given the observations so far."""
    tests = shlex.join(task.test_command)
    turn = len(observations)
    if turn == 0:
        return format_tool_call("run_command", {"cmd": tests})
    if k == 2:
        return format_tool_call("finish", {"summary": "I could not find the bug."})
    if k == 1:
        plan = [format_tool_call("apply_patch", {"patch": task.reference_patch()}),
                format_tool_call("run_command", {"cmd": tests})]  # fmt: skip
        return plan[turn - 1] if turn <= len(plan) else _finish(observations[-1])
    if turn == 1:  # the failing test's assertion names the function under test
        function = _FAILING_CALL.search(observations[0])[1]
        return format_tool_call("search", {"pattern": rf"def {function}\("})
    if turn == 2:  # search printed path:line: text
        return format_tool_call("read_file", {"path": observations[1].split(":", 1)[0]})
    if turn == 3:  # the edit is computed from the text read_file showed
        path = observations[1].split(":", 1)[0]
        shown = "\n".join(_NUMBERED.match(line)[1] for line in observations[2].splitlines())
        fixed = fixed_files(task)[path][1]
        edit = minimal_edits(path, shown + "\n", fixed)[0]
        return format_tool_call("edit_file", {"path": path, "old": edit.old, "new": edit.new})
    if turn == 4:
        return format_tool_call("run_command", {"cmd": tests})
    return _finish(observations[-1])


def _finish(last_test_run: str) -> str:
    passed = last_test_run.rstrip().endswith("exit code 0")
    return format_tool_call("finish", {"summary": "Fixed." if passed else "Still failing."})


def scripted_generate(model, tokenizer, tasks):
    """A GenerateFn: decodes each prompt, finds its task and its observations, and returns
    the scripted call's token ids with the model's log-probs of them."""
    started: dict[str, int] = {}

    def generate(prompts, caps, seed):
        out = []
        for prompt, cap in zip(prompts, caps, strict=True):
            text = tokenizer.decode(prompt, skip_special_tokens=False)
            (task,) = [t for t in tasks if initial_message(t) in text]
            observations = _RESPONSE.findall(text)
            if not observations:
                started[task.id] = started.get(task.id, -1) + 1
            call = _next_call(task, started[task.id] % K, observations)
            ids = tokenizer(call + IM_END, add_special_tokens=False)["input_ids"][:cap]
            full = torch.tensor([prompt + ids])
            with torch.no_grad():
                lp = token_logprobs(model(full).logits, full)[0, len(prompt) - 1 :]
            out.append(Completion(ids, lp.tolist(), "stop" if len(ids) < cap else "length"))
        return out

    return generate


@pytest.fixture(scope="module")
def rollouts(model, tokenizer, tasks):
    return sample_episodes(tasks[:1], model, tokenizer, ROLLOUT, ENV, SandboxConfig(),
                           generate_fn=scripted_generate(model, tokenizer, tasks))  # fmt: skip


def test_the_scripted_policy_fixes_through_free_form_tools_only(rollouts):
    assert [r.result.status for r in rollouts] == ["ok"] * K
    assert [r.result.success for r in rollouts] == [True, True, False]
    assert [r.result.end_reason for r in rollouts] == ["finished"] * K
    actions = [e["action"] for r in rollouts for e in r.result.record["trajectory"]
               if e["role"] == "assistant"]  # fmt: skip
    assert set(actions) == set(FREE_FORM)  # every free-form tool, and no other
    assert all(r.result.invalid_calls == 0 for r in rollouts)
    assert [r.result.reward for r in rollouts] == [1.0, 1.0, 0.0]


def test_prompt_and_reward_hold_only_the_free_form_set(rollouts, tokenizer):
    for r in rollouts:
        prompt = tokenizer.decode(r.input_ids[: r.assistant_mask.index(1)])
        for name in TOOL_SPECS:
            assert (f"{name}(" in prompt) == (name in FREE_FORM), name
        assert list(r.result.reward_terms) == list(reward_terms("free_form"))
        assert r.result.record["trajectory"][0]["tool_set"] == "free_form"


def test_grpo_batch_and_metrics_of_free_form_episodes(rollouts, tokenizer, tasks):
    rewards, groups, valid = rollout_rewards(rollouts)
    advantages = group_advantages(rewards, groups, scale_by_std=True, valid_mask=valid)  # [B]
    assert valid.all() and advantages[0] > 0 and advantages[1] > 0 and advantages[2] < 0
    batch = collate_rollouts(rollouts, tokenizer.pad_token_id)
    width = max(len(r.input_ids) for r in rollouts)
    assert batch["input_ids"].shape == (K, width) == per_token(advantages, rollouts).shape
    assert batch["assistant_mask"].sum() == sum(r.num_generated_tokens for r in rollouts)
    report = aggregate([r.result for r in rollouts], tasks={t.id: t for t in tasks})
    overall = report["overall"]
    assert overall["success_rate"] == pytest.approx(2 / 3) and overall["valid_call_rate"] == 1.0
    assert set(overall["reward_term_means"]) == set(reward_terms("free_form"))
    assert overall["safety_violation_rate"] == 0.0


def test_grpo_updates_the_policy_on_free_form_episodes(policy, tasks, tmp_path):
    import copy

    model, tokenizer = copy.deepcopy(policy[0]), policy[1]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = GRPOConfig(iterations=1, tasks_per_iteration=1, group_size=K, learning_rate=1e-3,
                        minibatch_size=K, micro_batch_size=K, output_dir=str(tmp_path))  # fmt: skip
    result = train_grpo(model, tokenizer, tasks[:1], config, ROLLOUT, ENV, SandboxConfig(),
                        generate_fn=scripted_generate(model, tokenizer, tasks))  # fmt: skip
    (row,) = result.metrics
    assert row["episodes"] == K and row["infra_failures"] == 0
    assert row["success_rate"] == pytest.approx(2 / 3) and row["update_tokens"] > 0
    assert {k.removeprefix("reward/") for k in row if k.startswith("reward/")} == set(
        reward_terms("free_form")
    )
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
