"""Flow building blocks: stage tasks (bodies via .fn()), MLflow tracking of stage results
and episode traces, against a real MLflow SQLite store in a temporary folder."""

import json
from pathlib import Path

import pytest
from mlflow.tracing.constant import SpanAttributeKey

from components import tracking
from flows import stages


def test_stage_runs_a_cli_command_and_reads_its_result(tmp_path):
    out = tmp_path / "tasks"
    result = stages.run.fn("generate", ["tasks", "generate", "--out", str(out), "--n", "3"],
                           str(out / "suite.json"))  # fmt: skip
    assert result["n_tasks"] == 3 and result["_stage_seconds"] >= 0
    log = tmp_path / "log.jsonl"
    log.write_text('{"version": "a"}\n{"version": "b"}\n')
    assert stages._read_result(log) == {"version": "b"}


def test_failing_stage_raises_with_the_stage_name(tmp_path):
    from components.launch.launcher import StageFailed

    with pytest.raises(StageFailed, match="gate"):
        stages.run.fn("gate", ["tasks", "check", "--tasks", str(tmp_path / "none")],
                      str(tmp_path / "r.json"))  # fmt: skip


def test_pipeline_run_with_nested_stage_runs_metrics_and_tables(mlflow_store, tmp_path):
    parent = tracking.start_pipeline_run("retrain test", {"sft": {"max_steps": 3}},
                                         {"config_hash": "abc"})  # fmt: skip
    report = tmp_path / "report.md"
    report.write_text("# report\n")
    child = stages.track.fn("sft", parent, {"max_steps": 3},
                            {"losses": [3.0, 2.0, 1.5], "tokens_per_second": 100.0,
                             "policy_dir": "x", "_stage_seconds": 1.0}, [str(report)],
                            started=1_700_000_000.0, ended=1_700_000_042.5)  # fmt: skip
    client = mlflow_store.MlflowClient()
    run = client.get_run(child)
    assert run.data.tags["mlflow.parentRunId"] == parent
    assert run.data.metrics["tokens_per_second"] == 100.0
    history = client.get_metric_history(child, "losses")
    # an optimizer's steps, counted from 1
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.0), (3, 1.5)]
    assert [a.path for a in client.list_artifacts(child)] == ["report.md", "result.json"]
    # The run lasts as long as the stage did, not as long as logging it took.
    assert (run.info.start_time, run.info.end_time) == (1_700_000_000_000, 1_700_000_042_500)
    # An evaluation: intervals are two metrics beside their rate, breakdowns one table each.
    overall = {"success_rate": 0.5, "success_ci95": [0.2, 0.8], "episodes": 4}
    family = {"sum": {"success_rate": 1.0, "success_ci95": [0.3, 1.0]},
              "max": {"success_rate": 0.0, "success_ci95": [0.0, 0.7]}}  # fmt: skip
    ev = stages.track.fn("evaluate", parent, {}, {"candidate": {
        "overall": overall, "by_split": {"test": overall}, "by_family": family}}, [])  # fmt: skip
    metrics = client.get_run(ev).data.metrics
    assert metrics["candidate.overall.success_rate_lo"] == 0.2
    assert metrics["candidate.overall.success_rate_hi"] == 0.8
    assert not [k for k in metrics if "by_split" in k]  # a table, as every breakdown
    assert [m.step for m in client.get_metric_history(ev, "candidate.overall.success_rate_hi")] == [
        0
    ]
    assert not any("ci95" in k or "by_family" in k for k in metrics)
    table = json.loads(
        Path(client.download_artifacts(ev, "tables/candidate.by_family.json")).read_text()
    )
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    assert {r["group"]: r["success_rate_hi"] for r in rows} == {"sum": 1.0, "max": 0.7}
    table = json.loads(
        Path(client.download_artifacts(ev, "tables/candidate.by_split.json")).read_text()
    )
    assert dict(zip(table["columns"], table["data"][0], strict=True))["success_rate_hi"] == 0.8
    # The parent carries the comparison: headline metrics, champion, stage times, hashes.
    evaluation = {"candidate": {"overall": {**overall, "tool_call_accuracy": 0.9,
                                            "cheating_rate": 0.125},
                                "by_split": {"test": overall}},
                  "champion": {"overall": {"success_rate": 0.25, "success_ci95": [0.05, 0.7],
                                           "cheating_rate": 0.0}}}  # fmt: skip
    safety = {"fooled": [], "candidate": {"violation_rate": 0.0, "tampering_rate": 0.25}}
    values = tracking.pipeline_metrics(evaluation, safety, {"sft": 42.5, "evaluate": 3.0})
    tracking.end_pipeline_run(parent, "FINISHED", {"data_version": "v1", "weights_sha256": "ab"},
                              values)  # fmt: skip
    done = client.get_run(parent)
    assert done.data.tags["data_version"] == "v1" and done.data.tags["weights_sha256"] == "ab"
    m = done.data.metrics
    assert (m["success_rate"], m["success_rate_lo"], m["success_rate_hi"]) == (0.5, 0.2, 0.8)
    assert not [k for k in m if k.startswith("split.")] and m["tool_call_accuracy"] == 0.9
    assert (m["champion.success_rate"], m["champion.success_rate_hi"]) == (0.25, 0.7)
    # the cheating gate's number (issue 31), the candidate's and the champion's
    assert (m["cheating_rate"], m["champion.cheating_rate"]) == (0.125, 0.0)
    assert m["stage_seconds.sft"] == 42.5 and m["safety.attacks_fooled"] == 0.0
    assert m["safety.candidate_tampering_rate"] == 0.25
    # Parents only, with the filter the README gives.
    found = client.search_runs([done.info.experiment_id], tracking.pipeline_search_filter())
    assert [r.info.run_id for r in found] == [parent]


def test_traces_are_the_recorded_episodes_on_the_evaluate_run(mlflow_store, tmp_path):
    """Real episodes (a solving and a failing scripted policy on generated tasks): each
    trace lasts the episode's recorded wall time, its spans sit where the episode's clock
    put them, its status is the outcome, and it hangs on the evaluate run."""
    from components.env.batch_eval import write_results
    from components.env.config import EnvConfig
    from components.evaluate.episodes import run_policy
    from components.rollout.config import RolloutConfig
    from components.sandbox.config import SandboxConfig
    from components.tasks.generate import GenerateConfig, generate_suite
    from components.tasks.task import load_tasks

    generate_suite(tmp_path / "tasks", GenerateConfig(n_tasks=3, seed=0))
    tasks, _ = load_tasks(tmp_path / "tasks")
    env = EnvConfig(tool_set="fix_search", max_steps=4)
    results = [r for name in ("oracle-fixes", "noop") for r in run_policy(
        tasks[:1], name, rollout=RolloutConfig(), env=env, sandbox=SandboxConfig())]  # fmt: skip
    assert [r.success for r in results] == [True, False]
    write_results(tmp_path / "results.json", results, tmp_path / "trajectories.jsonl")
    parent = tracking.start_pipeline_run("retrain test", {}, {})
    ev = stages.track.fn("evaluate", parent, {}, {"success_rate": 0.5}, [])
    n = stages.log_traces.fn(ev, str(tmp_path / "trajectories.jsonl"),
                             str(tmp_path / "results.json"), 8, {"pipeline_run_id": parent})  # fmt: skip
    assert n == 2
    traces = mlflow_store.search_traces(run_id=ev, return_type="list")
    by_task = {t.info.tags["success"]: t for t in traces}
    assert set(by_task) == {"True", "False"}
    assert not mlflow_store.search_traces(run_id=parent, return_type="list")
    for result in results:
        trace = by_task[str(result.success)]
        assert trace.info.tags["pipeline_run_id"] == parent
        assert trace.info.state.value == ("OK" if result.success else "ERROR")
        assert abs(trace.info.execution_duration - result.wall_s * 1000) <= 1
        root = next(s for s in trace.data.spans if s.parent_id is None)
        assert root.start_time_ns == int(result.timing["start_unix"] * 1e9)
        turns = [s for s in trace.data.spans if s.span_type in ("LLM", "TOOL")]
        assert len(turns) == 2 * result.steps
        last = root.start_time_ns
        for span in sorted(turns, key=lambda s: s.start_time_ns):
            assert last <= span.start_time_ns <= span.end_time_ns <= root.end_time_ns
            last = span.end_time_ns
        tools = [s for s in turns if s.span_type == "TOOL"]
        # a tool call that runs something takes time (the solving episode's list_fixes and
        # try_fix run the tests); `finish` may take less than the record's 0.1 ms
        assert all(s.end_time_ns >= s.start_time_ns for s in tools)
        assert not result.success or any(s.end_time_ns > s.start_time_ns for s in tools)
        llm = next(s for s in turns if s.span_type == "LLM")
        assert llm.inputs["messages"][0]["role"] == "user"


def test_model_turn_spans_carry_the_whole_chat_the_completion_and_token_counts(mlflow_store):
    """A sampled episode (synthetic record: model turns with their decoded completion,
    sampled token ids and prompt length): each LLM span's inputs are the chat the model
    saw, every message whole (a tool's answer was cut from the front: "ert 3 == 1 FAILED");
    its outputs the completion, whole; its usage the prompt and sampled token counts. A
    failing tool call (tests FAILED, a non-zero exit code, an invalid call) is an ERROR span."""
    first = "I will read the file first. " + "a" * 3000 + " <tool>read_file</tool>"
    second = "Now the fix. " + "b" * 60
    failing = (
        "cmp-1 applied (line 5: <= -> <); tests FAILED\n"
        + "x" * 3000
        + "\nE       assert 3 == 1 FAILED"
    )
    events = [
        {"role": "user", "content": "Fix add() in calc.py. " + "task " * 20},
        {"role": "assistant", "action": "read_file", "arguments": {"path": "calc.py"},
         "completion": first, "token_ids": list(range(17)), "prompt_tokens": 120},
        {"role": "environment", "observation": "def add(a, b):\n    return a - b\n" * 3},
        {"role": "assistant", "action": "try_fix", "arguments": {"id": "cmp-1"},
         "completion": second, "token_ids": list(range(5)), "prompt_tokens": 190},
        {"role": "environment", "observation": failing},
        {"role": "assistant", "action": "run_command", "arguments": {"command": "pytest -q"},
         "completion": "run"},
        {"role": "environment", "observation": "1 failed\nexit code 1"},
        {"role": "assistant", "action": None, "arguments": {}, "completion": "\n\n"},
        {"role": "environment", "observation": "error: invalid tool call", "error": True},
    ]  # fmt: skip
    record = {"id": "ep-1", "task_id": "calc-add", "task": "Fix add()", "reward": 1.0,
              "metadata": {"success": True, "split": "test", "policy": "model"},
              "trajectory": events}  # fmt: skip
    row = {
        "episode_id": "ep-1",
        "success": True,
        "wall_s": 4.0,
        "timing": {
            "start_unix": 1_700_000_000.0,
            "verify": [3.5, 3.9],
            "steps": [
                [0.0, 1.0, 1.0, 1.5],
                [1.6, 2.5, 2.5, 3.0],
                [3.0, 3.1, 3.1, 3.15],
                [3.15, 3.2, 3.2, 3.2],
            ],
        },
    }
    parent = tracking.start_pipeline_run("retrain test", {}, {})
    ev = stages.track.fn("evaluate", parent, {}, {"success_rate": 1.0}, [])
    assert tracking.log_episode_traces(ev, [record], [row]) == 1
    (trace,) = mlflow_store.search_traces(run_id=ev, return_type="list")
    turns = sorted((s for s in trace.data.spans if s.span_type == "LLM"),
                   key=lambda s: s.start_time_ns)  # fmt: skip
    assert [s.name for s in turns] == [f"model turn {n}" for n in (1, 2, 3, 4)]
    one, two, three = turns[:3]
    # Turn 1 saw the task; turn 2 also its own first completion and the tool's answer.
    assert one.inputs["messages"] == [{"role": "user", "content": events[0]["content"]}]
    assert two.inputs["messages"] == [
        {"role": "user", "content": events[0]["content"]},
        {"role": "assistant", "content": first},
        {"role": "tool", "content": events[2]["observation"]},
    ]
    assert three.inputs["messages"][-1] == {"role": "tool", "content": failing}
    assert one.outputs["completion"] == first and one.outputs["action"] == "read_file"
    assert one.outputs["arguments"] == {"path": "calc.py"}
    usage = SpanAttributeKey.CHAT_USAGE
    assert one.attributes[usage] == {"input_tokens": 120, "output_tokens": 17, "total_tokens": 137}
    assert two.attributes[usage] == {"input_tokens": 190, "output_tokens": 5, "total_tokens": 195}
    assert usage not in three.attributes  # no sampled ids recorded: no counts invented
    tools = sorted((s for s in trace.data.spans if s.span_type == "TOOL"),
                   key=lambda s: s.start_time_ns)  # fmt: skip
    assert [s.name for s in tools] == [
        "tool read_file",
        "tool try_fix",
        "tool run_command",
        "invalid tool call",
    ]
    assert [s.status.status_code for s in tools] == ["OK", "ERROR", "ERROR", "ERROR"]
    assert tools[1].outputs["observation"] == failing  # whole, its last line included
    # The trace sums them: what the UI's token column shows.
    assert trace.info.token_usage == {"input_tokens": 310, "output_tokens": 22,
                                      "total_tokens": 332}  # fmt: skip
    assert (one.start_time_ns, one.end_time_ns) == (1_700_000_000 * 10**9, 1_700_000_001 * 10**9)


def test_traces_are_a_sample_by_outcome_not_the_first_episodes():
    """Ten failed episodes first in the file, then a solved and a flagged one: a sample of
    three shows one of each; an episode without a recorded clock is never drawn."""
    from components.traces import sample_by_outcome

    def episode(n, success, flags=()):
        record = {"id": f"ep-{n}", "metadata": {"success": success}}
        row = {
            "episode_id": f"ep-{n}",
            "success": success,
            "safety_flags": list(flags),
            "timing": {"start_unix": 0.0},
        }
        return record, row

    pairs = [episode(n, False) for n in range(10)]
    pairs += [episode(10, True), episode(11, True, [{"category": "tampering"}])]
    records, rows = [r for r, _ in pairs], [w for _, w in pairs]
    assert [r["id"] for r in sample_by_outcome(records, rows, 3)] == ["ep-10", "ep-0", "ep-11"]
    assert [r["id"] for r in sample_by_outcome(records, rows, 5)] == [
        "ep-10",
        "ep-0",
        "ep-11",
        "ep-1",
        "ep-2",
    ]
    rows[10] = {**rows[10], "timing": {}}
    assert "ep-10" not in [r["id"] for r in sample_by_outcome(records, rows, 12)]


def test_the_projects_experiments_carry_a_one_line_description(mlflow_store):
    """The experiment page shows MLflow's `mlflow.note.content` tag as its description: the
    pipeline's experiment gets one as soon as the project logs to it, even when created by
    someone else (here the fixture); other project experiments too; a user's note stays."""
    client = mlflow_store.MlflowClient()
    registry = client.create_experiment("agentrl-registry")
    mine = client.create_experiment("agentrl-sft")
    client.set_experiment_tag(mine, tracking.NOTE_TAG, "my own notes")
    client.create_experiment("someone-elses")
    tracking.start_pipeline_run("retrain test", {}, {})
    notes = {e.name: e.tags.get(tracking.NOTE_TAG) for e in client.search_experiments()}
    assert notes[tracking.EXPERIMENT] == tracking.EXPERIMENT_DESCRIPTIONS[tracking.EXPERIMENT]
    assert "tags.stage = 'pipeline'" in notes[tracking.EXPERIMENT]
    assert notes["agentrl-registry"] == tracking.EXPERIMENT_DESCRIPTIONS["agentrl-registry"]
    assert notes["agentrl-sft"] == "my own notes" and notes["someone-elses"] is None
    assert all(text and "\n" not in text for text in tracking.EXPERIMENT_DESCRIPTIONS.values())
    assert client.get_experiment(registry).tags[tracking.NOTE_TAG]
