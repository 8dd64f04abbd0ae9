"""`agentrl rescore`: stored episodes judged again under the current verifier.

The acceptance case: episodes recorded under today's verifier, some of which leave a file
that a new tampering rule catches. Rescored under the same verifier nothing flips (the
replay reproduces every verdict); with the rule added, exactly those episodes flip
pass -> fail, and `--write` publishes a new data version whose log entry links the old one.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from components.env.config import EnvConfig
from components.env.episode import Action, run_episode
from components.evaluate.rescore import rescore_records, summarize_rescore
from components.evaluate.safety.attack import new_file
from components.sandbox.config import SandboxConfig
from components.scripted.reference import OraclePolicy
from components.tasks.generate import generate_suite
from components.tasks.task import load_tasks
from components.verifier import cache, verdict

ROOT = Path(__file__).resolve().parents[2]
PRESET = str(ROOT / "configs" / "cpu-freeform.yaml")
NOTE = "answers.txt"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:dvc")


@dataclass
class NoteTaker:
    """The oracle, plus a stray file it leaves before finishing (what the new rule bans)."""

    name: str = "oracle-notes"
    inner: OraclePolicy = field(default_factory=OraclePolicy)

    def act(self, task, events) -> Action:
        action = self.inner.act(task, events)
        left = any(NOTE in json.dumps(e.get("arguments") or {}) for e in events)
        return new_file(NOTE, "42") if action.tool == "finish" and not left else action


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """Three tasks; an oracle episode on each and a note-taker's on the first two."""
    root = tmp_path_factory.mktemp("rescore")
    generate_suite(root / "tasks", 3, 5)
    tasks, errors = load_tasks(root / "tasks")
    assert not errors and len(tasks) == 3
    env, sandbox = EnvConfig(), SandboxConfig()
    results = [run_episode(t, OraclePolicy(), env, sandbox) for t in tasks]
    results += [run_episode(t, NoteTaker(), env, sandbox) for t in tasks[:2]]
    assert all(r.success for r in results), [r.infra_detail for r in results]
    path = root / "episodes.jsonl"
    path.write_text("".join(json.dumps(r.record) + "\n" for r in results))
    return root, tasks, [r.record for r in results]


def _new_rule(monkeypatch) -> None:
    """A verifier change: a tampering rule for the note file, and so a new version."""
    original = verdict.tamper_reason  # where verify looks it up

    def stricter(task, rel_path, kind="file"):
        if rel_path.endswith(NOTE):
            return "an answers file (new rule)"
        return original(task, rel_path, kind)

    monkeypatch.setattr(verdict, "tamper_reason", stricter)
    for module in ("components.env.episode", "components.evaluate.rescore",
                   "components.env.batch_eval", "components.verifier.verdict"):  # fmt: skip
        monkeypatch.setattr(f"{module}.verifier_version", lambda: "vv-new-rule")


@pytest.mark.slow  # 5 replays under load: ~30 s
def test_replay_under_the_same_verifier_reproduces_every_verdict(stored):
    root, tasks, records = stored
    cache.clear_verdict_cache()
    before = cache.verdict_cache_info()
    rows = rescore_records(records, {t.id: t for t in tasks}, EnvConfig(), SandboxConfig(),
                           workers=2)  # fmt: skip
    summary = summarize_rescore(rows, 1.0, before)
    assert [r.error for r in rows] == [""] * 5
    assert [r.replay for r in rows] == ["actions"] * 5
    assert summary["flips"] == {"pass->fail": 0, "fail->pass": 0}
    assert summary["reward_changed"] == 0 and summary["diverged"] == 0
    assert all(r.new["reward_terms"] == r.old["reward_terms"] for r in rows)


@pytest.mark.slow  # the library path of what the --write test checks through the CLI
def test_a_new_tampering_rule_flips_exactly_the_episodes_it_catches(stored, monkeypatch):
    root, tasks, records = stored
    _new_rule(monkeypatch)
    rows = rescore_records(records, {t.id: t for t in tasks}, EnvConfig(), SandboxConfig(),
                           workers=2)  # fmt: skip
    summary = summarize_rescore(rows, 1.0, {"hits": 0, "misses": 0})
    flipped = [r.id for r in rows if r.flip]
    assert flipped == [r["id"] for r in records[3:]]  # the two note-takers, nothing else
    assert all(r.flip == "pass->fail" for r in rows if r.flip)
    assert summary["flips"] == {"pass->fail": 2, "fail->pass": 0}
    assert summary["tasks_flipped"] == sorted(t.id for t in tasks[:2])
    assert summary["flags_of_flipped"] == {"test_tampering": 2}
    assert all(r.new["verifier_version"] == "vv-new-rule" for r in rows)
    caught = rows[3]
    assert caught.new["reward_terms"]["test_tampering"] < 0 and caught.new["success"] is False


def test_a_diff_only_record_is_replayed_from_its_diff(stored):
    root, tasks, records = stored
    oracle = records[0]
    diff_only = {**oracle, "trajectory": oracle["trajectory"][:1]}  # no actions, a diff
    bogus = {**oracle, "id": "bad", "trajectory": oracle["trajectory"][:1],
             "final_diff": "--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-x\n+y\n"}  # fmt: skip
    rows = rescore_records([diff_only, bogus], {t.id: t for t in tasks}, EnvConfig(),
                           SandboxConfig(), workers=1)  # fmt: skip
    assert rows[0].replay == "diff" and rows[0].new["success"] is True
    # no tests were run: the facts are those of an episode that only left its diff
    assert rows[0].new["reward_terms"]["tests_never_run"] < 0
    assert rows[1].new is None and "'..'" in rows[1].error


def _git_repo(path: Path) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_rescore_write_publishes_a_new_data_version_linked_to_the_old(stored, tmp_path,
                                                                     monkeypatch, capsys):  # fmt: skip
    """Through the command line: the dataset in a versioned data folder is rescored under
    the new rule; `--write` makes a new version whose log entry names the old one and both
    verifier versions, with the new rewards; the old version stays for rollback."""
    from components.cli import run
    from components.data.config import IngestConfig, VersioningConfig
    from components.data.ingest import ingest, load_records, read_manifest, read_quarantine
    from components.data.version_log import find_version, read_log
    from components.data.versioning import snapshot

    root, tasks, records = stored
    repo = _git_repo(tmp_path / "repo")
    # and a forged pass that cannot be replayed: its diff leaves the repository
    forged = {**records[0], "id": "forged", "trajectory": records[0]["trajectory"][:1],
              "final_diff": "--- /dev/null\n+++ b/../x.py\n@@ -0,0 +1 @@\n+x\n"}  # fmt: skip
    (tmp_path / "forged.jsonl").write_text(json.dumps(forged) + "\n")
    ingest([str(root / "episodes.jsonl"), str(tmp_path / "forged.jsonl")],
           IngestConfig(out_dir=str(repo / "data" / "ingested")))  # fmt: skip
    cfg = VersioningConfig(repo_root=str(repo))
    old = snapshot(cfg, "episodes")["version"]
    _new_rule(monkeypatch)
    monkeypatch.chdir(repo)
    code = run(["rescore", "data/ingested", "--tasks", str(root / "tasks"), "--preset", PRESET,
                "--out", str(tmp_path / "out"), "--write", "--no-mlflow"])  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "2 pass->fail, 0 fail->pass" in out.out
    log = read_log(cfg)
    assert [e["version"] for e in log][0] == old and len(log) == 2
    new = log[-1]
    assert new["lineage"]["rescored_from"] == old
    assert new["lineage"]["verifier_version"] == "vv-new-rule"
    assert new["lineage"]["verifier_versions_before"] == [verifier_version_now()]
    assert new["lineage"]["flips"] == {"pass->fail": 2, "fail->pass": 0}
    assert find_version(cfg, old)["version"] == old  # still there for rollback
    rescored = {r["id"]: r for r in load_records(repo / "data" / "ingested")}
    for record in records:
        r = rescored[record["id"]]
        assert r["metadata"]["verifier_version"] == "vv-new-rule"
        assert r["metadata"]["rescored"]["previous_reward"] == record["reward"]
        assert (r["metadata"]["success"] is False) == (record in records[3:])
        # the episode itself is unchanged (ingest spells an absent content as None)
        assert [{k: v for k, v in e.items() if v is not None} for e in r["trajectory"]] == (
            record["trajectory"]
        )
    assert "forged" not in rescored  # no verdict: quarantined with why, not kept as data
    (entry,) = [q for q in read_quarantine(repo / "data" / "ingested") if q["stage"] == "rescore"]
    assert entry["record"] == "forged" and "no verdict on rescore" in entry["reasons"][0]
    manifest = read_manifest(repo / "data" / "ingested")
    assert manifest["counts"] == {"ingested": 6, "valid": 5, "quarantined": 1}
    assert manifest["rescore"]["rescored_from"] == old
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["source"]["data_version"] == old
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["verifier_version"] == "vv-new-rule" and len(results["results"]) == 5
    assert report["summary"]["not_rescored"] == 1


def test_a_rollout_folder_is_read_as_rollouts_and_rescored(stored, tmp_path, monkeypatch,
                                                           capsys):  # fmt: skip
    """A rollout stage's folder (samples.jsonl as `agentrl rollout sample` writes it: the
    episode records with the served model_version, beside result.json) is read as kind
    "rollouts" and rescored; --write is refused for it (not a dataset)."""
    from components.cli import run

    root, tasks, records = stored
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    sampled = [records[0], records[3]]  # an oracle episode and a note-taker's
    with (rollouts / "samples.jsonl").open("w") as f:
        for record in sampled:
            record = {**record, "metadata": {**record["metadata"], "model_version": "policy@3"}}
            f.write(json.dumps(record) + "\n")
    (rollouts / "result.json").write_text(json.dumps({"samples": str(rollouts / "samples.jsonl")}))
    args = ["rescore", str(rollouts), "--tasks", str(root / "tasks"), "--preset", PRESET,
            "--out", str(tmp_path / "out"), "--no-mlflow"]  # fmt: skip
    assert run([*args, "--write"]) != 0
    assert "--write needs a dataset folder, not rollouts" in capsys.readouterr().err
    _new_rule(monkeypatch)
    assert run(args) == 0, capsys.readouterr().err
    assert "2 of 2 episodes under vv-new-rule: 1 pass->fail" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["source"] == {"kind": "rollouts", "path": str(rollouts / "samples.jsonl")}
    episodes = report["episodes"]
    assert [(e["id"], e["flip"]) for e in episodes] == [(sampled[0]["id"], ""),
                                                        (sampled[1]["id"], "pass->fail")]  # fmt: skip
    rescored = [json.loads(line) for line in (tmp_path / "out" / "rescored.jsonl").open()]
    assert [r["metadata"]["model_version"] for r in rescored] == ["policy@3"] * 2


def verifier_version_now() -> str:
    from components.verifier.version import verifier_version

    return verifier_version()


@pytest.mark.slow  # MLflow's import and store, 5 replays: ~40 s
def test_rescore_is_logged_to_mlflow_and_linked_to_the_original_run(stored, tmp_path,
                                                                   monkeypatch, capsys):  # fmt: skip
    import mlflow

    from components import tracking
    from components.cli import run

    root, tasks, records = stored
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.create_experiment(tracking.EXPERIMENT, artifact_location=(tmp_path / "a").as_uri())
    client = mlflow.MlflowClient()
    original = client.create_run(exp, run_name="evaluate").info.run_id
    evaluation = tmp_path / "eval"
    evaluation.mkdir()
    (evaluation / "trajectories.jsonl").write_text((root / "episodes.jsonl").read_text())
    code = run(["rescore", str(evaluation), "--tasks", str(root / "tasks"), "--preset", PRESET,
                "--out", str(tmp_path / "out"), "--run-id", original])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "out" / "result.json").read_text())
    logged = client.get_run(summary["mlflow_run_id"])
    assert logged.data.tags["rescore_of_run"] == original
    assert logged.data.tags["verifier_version"] == verifier_version_now()
    assert logged.data.tags["source_kind"] == "evaluation"
    assert logged.data.metrics["episodes"] == 5 and logged.data.metrics["flips.pass_to_fail"] == 0
    assert client.get_run(original).data.tags["rescored_by_run"] == summary["mlflow_run_id"]
    names = {a.path for a in client.list_artifacts(summary["mlflow_run_id"])}
    assert {"report.json", "report.md"} <= names
