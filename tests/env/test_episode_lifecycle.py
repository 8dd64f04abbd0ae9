"""EpisodeEnv's lifecycle: stop / abort / finish, the one record builder, the stored diff."""

from __future__ import annotations

import os
import shutil

import pytest

from components.env import episode as episode_module
from components.env.config import EnvConfig
from components.env.episode import Action, EpisodeEnv
from components.env.final_diff import MAX_DIFF_INPUT_BYTES, diff_changed_lines, repo_diff
from components.sandbox.config import SandboxConfig
from components.tasks.patching import apply_unified_diff, parse_unified_diff
from components.verifier.snapshot import changed_files


@pytest.fixture
def task(suite_tasks):
    return suite_tasks[0]


def new_env(task, **kwargs) -> EpisodeEnv:
    return EpisodeEnv(task, EnvConfig(max_steps=5), SandboxConfig(), policy_name="t", **kwargs)


def no_verification(monkeypatch):
    def verify(*args, **kwargs):
        raise AssertionError("an aborted episode is not verified")

    monkeypatch.setattr(episode_module, "verify", verify)


def test_stop_ends_the_episode_with_the_first_reason(task):
    env = new_env(task)
    with pytest.raises(ValueError, match="unknown end reason"):
        env.stop("tired")
    assert not env.done
    env.stop("token_limit")
    env.stop("finished")  # already over: the first reason stands
    assert env.done and env.end_reason == "token_limit"
    with pytest.raises(RuntimeError, match="already over"):
        env.step(Action("finish", {}))
    result = env.finish(num_tokens=7)
    assert result.status == "ok" and result.end_reason == "token_limit"
    assert result.reward is not None and result.final_diff == ""
    assert result.record["metadata"]["num_tokens"] == 7
    assert result.record["metadata"]["end_reason"] == "token_limit"
    assert result.record["final_diff"] == ""
    assert not env.workspace.root.exists()


def test_abort_is_an_unverified_unrewarded_infra_failure(task, monkeypatch):
    no_verification(monkeypatch)
    env = new_env(task)
    env.step(Action("read_file", {"path": task.metadata.extra["module"]}))
    env.abort("backend failed: server went away")
    env.abort("a later fault")  # the first fault is the one reported
    assert env.done
    result = env.finish(num_tokens=3)
    assert (result.status, result.end_reason, result.reward) == (
        "infra_failure",
        "infra_failure",
        None,
    )
    assert result.infra_detail == "backend failed: server went away"
    assert result.final_diff is None and result.changed_files == [] and result.steps == 1
    meta = result.record["metadata"]
    assert (meta["status"], meta["success"], meta["num_tokens"]) == ("infra_failure", False, 3)
    assert result.record["reward"] is None and result.record["final_diff"] is None
    assert result.record["trajectory"] == env.events
    assert not env.workspace.root.exists()


def test_abort_after_stop_keeps_the_end_reason(task, monkeypatch):
    no_verification(monkeypatch)
    env = new_env(task)
    env.step(Action("finish", {}))
    env.abort("tool execution failed")
    result = env.finish()
    assert (result.status, result.end_reason) == ("infra_failure", "finished")


def test_a_verifier_crash_then_abort_gives_the_infra_failure(task, monkeypatch):
    """What the rollout engine does when verification raises: abort, finish again."""

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(episode_module, "verify", crash)
    env = new_env(task)
    env.stop("max_steps")
    with pytest.raises(OSError):
        env.finish()
    assert not env.workspace.root.exists()
    env.abort("verification failed: OSError('disk full')")
    result = env.finish()
    assert result.status == "infra_failure" and result.end_reason == "max_steps"
    assert "disk full" in result.infra_detail


def test_sampled_tokens_are_kept_on_the_assistant_event(task):
    env = new_env(task)
    env.step(
        Action(None, {}, content="??", parse_error="no call"),
        token_ids=[5, 6],
        logprobs=[-1.0, -2.0],
    )
    env.step(Action("finish", {}))
    sampled, _, plain, _ = env.events[1:]
    assert (sampled["token_ids"], sampled["logprobs"]) == ([5, 6], [-1.0, -2.0])
    assert "token_ids" not in plain and "logprobs" not in plain
    env.finish()


def test_the_stored_diff_rebuilds_the_agents_repository(task, tmp_path):
    """An edit_file and a patch that creates a file without a final newline: the stored
    diff applied to the task's repo gives the workspace the verifier saw."""
    module = task.metadata.extra["module"]
    first = (task.repo_dir / module).read_text().splitlines(keepends=True)[0]
    env = new_env(task)
    env.step(Action("edit_file", {"path": module, "old": first, "new": "# agent\n" + first}))
    create = "--- /dev/null\n+++ b/notes.txt\n@@ -0,0 +1,2 @@\n+one\n+two\n\\ No newline at end of file\n"
    env.step(Action("apply_patch", {"patch": create}))
    final = tmp_path / "final"
    shutil.copytree(env.workspace.root, final)
    result = env.finish()
    assert result.status == "ok" and sorted(result.changed_files) == sorted([module, "notes.txt"])
    assert result.final_diff == result.record["final_diff"]
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(task.repo_dir, rebuilt)
    apply_unified_diff(rebuilt, result.final_diff)
    for rel in result.changed_files:
        assert (rebuilt / rel).read_bytes() == (final / rel).read_bytes(), rel
    assert (rebuilt / "notes.txt").read_text() == "one\ntwo"
    assert diff_changed_lines(result.final_diff) == 3  # one added line, two new lines


def write(root, rel, data: bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_repo_diff_created_deleted_unterminated_and_symlinked_files(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    write(before, "keep.py", b"a = 1\nb = 2\n")
    write(before, "gone.py", b"x = 1\n")
    write(before, "tail.py", b"t = 1")  # no newline at the end
    write(after, "keep.py", b"a = 1\nb = 3\n")
    write(after, "pkg/new.py", b"n = 1\n")
    write(after, "tail.py", b"t = 2")
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret\n")
    os.symlink(secret, after / "link.txt")  # never followed: counts as absent
    files = changed_files(before, after)
    assert "link.txt" in files
    diff = repo_diff(before, after, files)
    assert "host secret" not in diff and "link.txt" not in diff
    by_path = {fp.new_path or fp.old_path: fp for fp in parse_unified_diff(diff)}
    assert sorted(by_path) == ["gone.py", "keep.py", "pkg/new.py", "tail.py"]
    assert by_path["gone.py"].new_path is None and by_path["pkg/new.py"].old_path is None
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(before, rebuilt)
    apply_unified_diff(rebuilt, diff)
    for rel in ("keep.py", "pkg/new.py", "tail.py"):
        assert (rebuilt / rel).read_bytes() == (after / rel).read_bytes(), rel
    assert not (rebuilt / "gone.py").exists()
    # keep 2 (-1 +1), gone 1, new 1, tail 2
    assert diff_changed_lines(diff) == 6
    assert repo_diff(before, before, ["keep.py"]) == ""


def test_repo_diff_is_none_above_its_size_limit(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    write(before, "big.txt", b"")
    write(after, "big.txt", b"x\n" * (MAX_DIFF_INPUT_BYTES // 2 + 1))
    assert repo_diff(before, after, ["big.txt"]) is None


def test_changed_lines_read_hunks_by_their_counts():
    """A removed "-- x" and an added "++ y" look like file headers ("--- x", "+++ y")."""
    diff = "--- a/q.sql\n+++ b/q.sql\n@@ -1,2 +1,2 @@\n keep\n--- x\n+++ y\n"
    assert diff_changed_lines(diff) == 2
    assert diff_changed_lines("") == 0
