"""Shared fixtures of the training tests: hand-built trajectory records, a tokenizer trained
once per session on them, and a fresh tiny policy (2 layers, 64 wide) per test.

Records are built by hand rather than by running the oracle: real pytest observations carry
wall times ("1 failed in 0.03s"), which would change the token ids and break golden losses.
"""

from __future__ import annotations

import copy

import pytest
import torch

# (task_id, module, function, buggy line, fixed line)
_TASKS = [
    ("train-0001", "mathx", "add", "return a - b", "return a + b"),
    ("train-0002", "strings", "shout", "return s.lower()", "return s.upper()"),
    ("train-0003", "lists", "last", "return xs[0]", "return xs[-1]"),
    ("train-0004", "clamp", "clamp", "return max(lo, x)", "return min(hi, max(lo, x))"),
    ("train-0005", "vowels", "count", "return 0", "return sum(c in 'aeiou' for c in s)"),
    ("train-0006", "sign", "sign", "return 1 if x > 0 else -1", "return (x > 0) - (x < 0)"),
]


def _user(module: str) -> dict:
    return {
        "role": "user",
        "content": f"The unit tests in tests/test_{module}.py fail. Run `python -m pytest -q` "
        f"to see the failures, then fix the bug in {module}.py.\n\nRepository files: "
        f"{module}.py, tests/test_{module}.py",
    }


def _env(text: str) -> dict:
    return {"role": "environment", "observation": text, "truncated": False}


def signed(record: dict) -> dict:
    """`record` with its verdict signed as an episode's finish signs it (under the current
    verifier version): the hand-built records stand for this pipeline's own episodes, and
    only signed verdicts train (components/verifier/provenance.py). Returns `record`."""
    from components.verifier.provenance import sign_record
    from components.verifier.version import verifier_version

    record["metadata"]["verifier_version"] = verifier_version()
    sign_record(record)
    return record


def _record(task_id: str, kind: str, events: list[dict], reward: float | None) -> dict:
    success = kind == "oracle"
    record = {
        "schema_version": 1,
        "id": f"{kind}-{task_id}",
        "task_id": task_id,
        "source": "oracle" if success else "rollout",
        "task": events[0]["content"],
        "trajectory": events,
        "reward": reward,
        "reward_terms": {"tests_pass": 1.0 if success else 0.0},
        "metadata": {
            "policy": kind,
            "split": "train",
            "success": success,
            "status": "ok" if reward is not None else "infra_failure",
        },
    }
    return signed(record) if reward is not None else record


def expert_record(task_id, module, function, bug, fix) -> dict:
    events = [
        _user(module),
        {"role": "assistant", "action": "run_command", "arguments": {"cmd": "python -m pytest -q"},
         "content": "Run the tests to see what fails."},
        _env(f"F\nFAILED tests/test_{module}.py::test_{function}_1\n1 failed\nexit code 1"),
        {"role": "assistant", "action": "read_file", "arguments": {"path": f"{module}.py"}},
        _env(f"   1| def {function}(*args):\n   2|     {bug}"),
        {"role": "assistant", "action": "edit_file",
         "arguments": {"path": f"{module}.py", "old": bug, "new": fix}, "content": "Fix the bug."},
        _env(f"edited {module}.py: replaced 1 occurrence"),
        {"role": "assistant", "action": "run_command", "arguments": {"cmd": "python -m pytest -q"}},
        _env("..\n2 passed\nexit code 0"),
        {"role": "assistant", "action": "finish", "arguments": {"summary": f"Fixed {function}."}},
        _env("episode finished"),
    ]  # fmt: skip
    return _record(task_id, "oracle", events, 1.0)


def failed_record(task_id, module, function, bug, fix) -> dict:
    events = [
        _user(module),
        {"role": "assistant", "action": "read_file", "arguments": {"path": f"{module}.py"}},
        _env(f"   1| def {function}(*args):\n   2|     {bug}"),
        {"role": "assistant", "action": "finish", "arguments": {"summary": "No changes made."}},
        _env("episode finished"),
    ]  # fmt: skip
    return _record(task_id, "noop", events, -0.3)


EXPERT_RECORDS = [expert_record(*t) for t in _TASKS]
FAILED_RECORDS = [failed_record(*t) for t in _TASKS]


@pytest.fixture(autouse=True)
def _one_thread():
    # Two shared cores; one thread also makes CPU float sums deterministic (golden values).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def expert_records() -> list[dict]:
    return copy.deepcopy(EXPERT_RECORDS)


@pytest.fixture
def failed_records() -> list[dict]:
    return copy.deepcopy(FAILED_RECORDS)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from components.policy.tokenizer import build_corpus, train_tokenizer

    corpus = build_corpus(EXPERT_RECORDS + FAILED_RECORDS, stdlib_bytes=50_000, seed=0)
    tokenizer = train_tokenizer(corpus, vocab_size=512)
    path = tmp_path_factory.mktemp("train_tokenizer")
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from components.policy.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir)


TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
            max_position_embeddings=1024, seed=0)  # fmt: skip


@pytest.fixture
def tiny_config(tokenizer_dir):
    from components.policy.config import PolicyConfig

    return PolicyConfig(**TINY, tokenizer_path=str(tokenizer_dir))


@pytest.fixture
def tiny_policy(tiny_config):
    """A fresh (model, tokenizer): same weights every time (seeded init)."""
    from components.policy.model import build_policy

    return build_policy(tiny_config)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    """A generated suite (3 tasks) and its first two train tasks, for GRPO runs."""
    from components.tasks.generate import generate_suite
    from components.tasks.task import load_tasks

    root = tmp_path_factory.mktemp("grpo_suite") / "tasks"
    generate_suite(root, 3, 0)
    tasks, errors = load_tasks(root, split="train")
    assert not errors and len(tasks) >= 2
    return root, tasks[:2]
