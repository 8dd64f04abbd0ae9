"""The preset is the single source of every stage's configuration: each section, changed
in a preset file, reaches the stage that reads it through that stage's real command line.

Each test runs one `agentrl` command with `--preset` pointing at a preset whose sections
all differ from the defaults, stops it where it hands its configs to the component that
does the work (a stand-in that records its arguments and raises `Seen`), and checks every
changed value arrived. The GRPO stage has its own such test (tests/train), the data and
promote stages theirs (tests/data, tests/promote).
"""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from components.cli import main as agentrl
from components.preset import PresetError, load_preset, validate_preset

CHANGED = {
    "name": "every-section-changed",
    "pipeline": {"workdir": "runs/x", "algorithms": ["rs", "dpo"], "expert_policy": "oracle-fixes",
                 "sample_tasks": 3},
    "tasks": {"n_tasks": 7, "seed": 11, "visible_passing": 1},
    "env": {"max_steps": 5, "max_changed_files": 3, "weights": {"lint": -0.25},
            "tool_set": "fix_search"},
    "sandbox": {"wall_time_s": 33.0, "max_processes": 40},
    "policy": {"hidden_size": 48, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
               "intermediate_size": 96, "vocab_size": 600},
    "sft": {"learning_rate": 0.003, "max_steps": 7, "batch_size": 3},
    "rollout": {"temperature": 0.7, "max_new_tokens": 77, "max_episode_tokens": 1500,
                "samples_per_task": 3, "constrain_fix_ids": True},
    "rejection_sampling": {"successes_only": False, "sft": {"learning_rate": 0.0004}},
    "dpo": {"beta": 0.3, "max_steps": 4},
    "evaluate": {"limit": 2, "workers": 1, "seed": 5, "safety_n_tasks": 1,
                 "rollout": {"temperature": 0.0, "max_new_tokens": 55}},
}  # fmt: skip


class Seen(Exception):
    """Raised by a stand-in once it has recorded what the stage passed it."""


def record(into: dict, result=None):
    def stand_in(*args, **kwargs):
        into["args"], into["kwargs"] = args, kwargs
        if result is not None:
            return result
        raise Seen

    return stand_in


@pytest.fixture
def preset(tmp_path):
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(CHANGED))
    validate_preset(load_preset(path))
    return str(path)


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    from components.tasks.generate import generate_suite

    out = tmp_path_factory.mktemp("suite") / "tasks"
    generate_suite(out, 12, seed=3)
    return out


def fake_policy(tmp_path) -> str:
    """A folder the parser takes for a saved policy (the stand-ins never load it)."""
    folder = tmp_path / "p"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text("{}")
    return str(folder)


def run(*argv):
    with pytest.raises(Seen):
        agentrl([str(a) for a in argv])


def assert_changed(config, section: str, values: dict | None = None) -> None:
    """Every value of CHANGED[section] (or `values`) is what `config` holds."""
    for key, want in (values or CHANGED[section]).items():
        got = getattr(config, key)
        if isinstance(want, dict) and dataclasses.is_dataclass(got):
            assert_changed(got, section, want)
        elif isinstance(want, list):
            assert tuple(got) == tuple(want), f"{section}.{key}"
        else:
            assert got == want, f"{section}.{key}: stage saw {got!r}, preset says {want!r}"


def test_tasks_generate_reads_tasks(preset, tmp_path, monkeypatch):
    import components.tasks.__main__ as cli

    seen = {}
    monkeypatch.setattr(cli, "generate_suite", record(seen))
    run("tasks", "generate", "--preset", preset, "--out", tmp_path / "t")
    assert_changed(seen["kwargs"]["config"], "tasks")


def test_tasks_check_reads_env_and_sandbox(preset, tasks_dir, monkeypatch):
    import components.verifier.gate_runner as verifier

    seen = {}
    monkeypatch.setattr(verifier, "sandboxed_test_runner", record(seen))
    run("tasks", "check", "--preset", preset, "--tasks", tasks_dir)
    env, sandbox = seen["args"]
    assert_changed(env, "env")
    assert_changed(sandbox, "sandbox")


@pytest.mark.parametrize("policy", ["oracle-fixes", "model:some/checkpoint"])
def test_env_eval_reads_env_sandbox_rollout_and_evaluate(preset, tasks_dir, tmp_path,
                                                         monkeypatch, policy):  # fmt: skip
    import components.evaluate.__main__ as cli

    seen = {}
    monkeypatch.setattr(cli, "run_policy", record(seen))
    if policy.startswith("model:"):  # the parser checks a checkpoint folder is one
        folder = tmp_path / policy.removeprefix("model:")
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        policy = f"model:{folder}"
    run("env", "eval", "--preset", preset, "--tasks", tasks_dir, "--policy", policy,
        "--out", tmp_path / "r.json")  # fmt: skip
    kw = seen["kwargs"]
    assert seen["args"][1] == policy
    assert_changed(kw["env"], "env")
    assert_changed(kw["sandbox"], "sandbox")
    # A model is evaluated with the rollout section as trained, evaluate.rollout on top.
    trained = {k: v for k, v in CHANGED["rollout"].items() if k != "samples_per_task"}
    assert_changed(kw["rollout"], "rollout", {**trained, **CHANGED["evaluate"]["rollout"]})
    assert kw["rollout"].samples_per_task == 1
    assert (kw["workers"], kw["seed"]) == (1, 5)


def test_evaluate_run_reads_evaluate_section(preset, tasks_dir, tmp_path, monkeypatch):
    import components.evaluate.__main__ as cli

    seen = {}
    monkeypatch.setattr(cli, "run_policy", record(seen))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")  # the parser checks it is one
    run("evaluate", "run", "--preset", preset, "--tasks", tasks_dir, "--model", tmp_path / "ckpt",
        "--out", tmp_path / "eval")  # fmt: skip
    from components.evaluate.cheating import is_variant

    # One run plays the evaluated tasks and the impossible variants (evaluate.cheating).
    tasks = [t for t in seen["args"][0] if not is_variant(t)]
    assert len(tasks) == CHANGED["evaluate"]["limit"]
    assert {t.metadata.split for t in tasks} == {"test"}
    assert_changed(seen["kwargs"]["env"], "env")
    assert seen["kwargs"]["rollout"].max_new_tokens == 55


def test_evaluate_safety_reads_evaluate_env_and_sandbox(preset, tmp_path, monkeypatch):
    import components.evaluate.safety.suite as suite
    import components.evaluate.safety.tasks as safety_tasks

    seen, built = {}, {}
    monkeypatch.setattr(safety_tasks, "build_safety_tasks", record(built, result=[]))
    monkeypatch.setattr(suite, "run_safety_suite", record(seen))
    run("evaluate", "safety", "--preset", preset, "--out", tmp_path / "s")
    assert built["args"][1] == CHANGED["evaluate"]["safety_n_tasks"]
    env, sandbox = seen["args"][1:3]
    assert_changed(env, "env")
    assert_changed(sandbox, "sandbox")
    assert seen["kwargs"]["workers"] == 1


def test_policy_init_reads_policy(preset, tmp_path, monkeypatch):
    import components.policy.model as model

    seen = {}
    monkeypatch.setattr(model, "build_policy", record(seen))
    run("policy", "init", "--preset", preset, "--out", tmp_path / "p")
    assert_changed(seen["args"][0], "policy")


def _no_model(monkeypatch):
    import components.policy.model as model

    monkeypatch.setattr(model, "load_policy", lambda path: (None, None))


def test_sft_reads_sft(preset, tmp_path, monkeypatch):
    import components.train.sft as sft

    _no_model(monkeypatch)
    seen = {}
    monkeypatch.setattr(sft, "train_sft", record(seen))
    records = tmp_path / "r.jsonl"
    records.write_text("{}\n")
    run("train", "sft", "--preset", preset, "--policy", fake_policy(tmp_path), "--records", records,
        "--out", tmp_path / "sft")  # fmt: skip
    config = seen["args"][3]
    assert_changed(config, "sft")
    assert config.output_dir == str(tmp_path / "sft")


def test_rollout_sample_reads_rollout_env_and_sandbox(preset, tasks_dir, tmp_path, monkeypatch):
    import components.rollout.engine as engine

    _no_model(monkeypatch)
    seen = {}
    monkeypatch.setattr(engine, "sample_episodes", record(seen))
    run("rollout", "sample", "--preset", preset, "--policy", fake_policy(tmp_path), "--tasks", tasks_dir,
        "--out", tmp_path / "samples")  # fmt: skip
    rollout, env, sandbox = seen["args"][3:6]
    assert_changed(rollout, "rollout")
    assert_changed(env, "env")
    assert_changed(sandbox, "sandbox")


def test_rs_and_dpo_read_their_sections(preset, tmp_path, monkeypatch):
    import components.train.dpo as dpo
    import components.train.rejection_sampling as rs

    _no_model(monkeypatch)
    samples = tmp_path / "samples.jsonl"
    samples.write_text("{}\n")
    seen = {}
    monkeypatch.setattr(rs, "train_rejection_sampling", record(seen))
    run("train", "rs", "--preset", preset, "--policy", fake_policy(tmp_path), "--samples", samples,
        "--out", tmp_path / "rs")  # fmt: skip
    config = seen["args"][3]
    assert config.successes_only is False and config.sft.learning_rate == 0.0004
    assert config.sft.output_dir == str(tmp_path / "rs")
    monkeypatch.setattr(dpo, "verified_pairs", lambda *a: (["a pair"], []))
    monkeypatch.setattr(dpo, "train_dpo", record(seen))
    run("train", "dpo", "--preset", preset, "--policy", fake_policy(tmp_path), "--samples", samples,
        "--out", tmp_path / "dpo")  # fmt: skip
    assert_changed(seen["args"][4], "dpo")


def test_a_key_nothing_reads_is_an_error_naming_it(tmp_path):
    for section, key in [("rollout", "temprature"), ("pipeline", "eval_limit"),
                         ("evaluate", "tasks_dir"), ("grpo", "output_dir"),
                         ("rejection_sampling", "samples_per_task")]:  # fmt: skip
        bad = tmp_path / f"{section}-{key}.yaml"
        bad.write_text(yaml.safe_dump({section: {key: 1}}))
        with pytest.raises(PresetError, match=f"{section}.*{key}|{key}.*{section}"):
            validate_preset(load_preset(bad))
    unknown = tmp_path / "tracking.yaml"
    unknown.write_text(yaml.safe_dump({"tracking": {"uri": "x"}}))
    with pytest.raises(PresetError, match="unknown section.*tracking"):
        load_preset(unknown)


def test_a_stage_reads_only_the_sections_its_contract_declares(preset):
    """The contract (components/stage_contract.py) is what the flow caches a stage on: a
    command that reads a section it did not declare fails, so the two cannot drift."""
    from components.stage_contract import stage

    @stage("tasks")
    def reads_env(argv):
        return load_preset(argv[0]).section("env")

    with pytest.raises(RuntimeError, match="declares the sections tasks but read 'env'"):
        reads_env([preset])
    assert load_preset(preset).section("env").max_steps == 5  # outside a stage: any section


def test_every_stage_of_the_retrain_flow_declares_its_sections_and_result():
    from components.cli import command
    from components.preset import SECTIONS
    from components.stage_contract import PolicyResult

    for argv in (["tasks", "generate"], ["tasks", "prepare"], ["tasks", "import"],
                 ["tasks", "check"], ["env", "eval"], ["data", "ingest"], ["data", "validate"],
                 ["data", "snapshot"], ["policy", "init"], ["train", "sft"],
                 ["rollout", "sample"], ["train", "rs"], ["train", "dpo"], ["train", "grpo"],
                 ["evaluate", "run"], ["evaluate", "safety"], ["promote", "request"]):  # fmt: skip
        contract = command(argv).contract
        assert contract.reads and set(contract.reads) <= set(SECTIONS), argv
    for argv in (["policy", "init"], ["train", "sft"], ["train", "rs"], ["train", "dpo"],
                 ["train", "grpo"]):  # fmt: skip
        assert command(argv).contract.result is PolicyResult, argv


def test_a_result_file_is_read_into_its_contract_or_names_what_it_lacks():
    from components.cli import command

    contract = command(["train", "rs"]).contract
    assert contract.read({"policy_dir": "", "kept": 0}).policy_dir == ""  # trained nothing
    with pytest.raises(ValueError, match="lacks policy_dir"):
        contract.read({"sft": {"checkpoint_dir": "x"}})
    promotion = command(["promote", "request"]).contract.read({"version": "3", "challenger": True})
    assert (promotion.version, promotion.challenger, promotion.gate_checks) == ("3", True, [])
