"""Preflight (issue 45, item 4): what a preset names outside itself is checked before a run's
first stage, one line per missing thing, exit 2: a checkpoint not fetched yet
(configs/cpu-pretrained.yaml before `policy fetch`), a GPU preset on a CPU machine
(configs/gpu-single.yaml), cluster access for a Kubernetes preset (configs/gpu-cluster.yaml).
Nothing is started or written before."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from components.preset import load_preset
from flows.retrain_main import preflight

ROOT = Path(__file__).resolve().parents[1]


def _copy(name: str, folder: Path, **changes) -> Path:
    """configs/NAME copied into `folder` (its relative paths then point into `folder`)."""
    preset = yaml.safe_load((ROOT / "configs" / name).read_text())
    for section, values in changes.items():
        preset[section] = {**(preset.get(section) or {}), **values}
    path = folder / name
    path.write_text(yaml.safe_dump(preset))
    return path


def test_retrain_before_policy_fetch_stops_before_prefect_and_writes_nothing(tmp_path):
    preset = _copy("cpu-pretrained.yaml", tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(tmp_path / "prefect"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}  # fmt: skip
    env.pop("PREFECT_API_URL", None)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "flows.retrain", "--preset", preset.name],
                            cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert all(line.startswith("python -m flows.retrain: ") for line in lines), lines
    (missing,) = [line for line in lines if "policy.pretrained_path" in line]
    assert "models/smollm2-135m-instruct: no such folder" in missing
    assert "agentrl policy fetch" in missing and "internal error" not in result.stderr
    assert "Prefect" not in result.stdout + result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [preset.name]  # nothing written
    assert time.monotonic() - started < 120


def test_a_gpu_preset_on_a_cpu_machine_names_each_missing_thing(tmp_path):
    preset = load_preset(_copy("gpu-single.yaml", tmp_path))
    problems = preflight(preset, gpu=False)
    assert [p.split(": ")[0] for p in problems] == [
        f"{preset.path}:policy.pretrained_path",
        f"{preset.path}:policy.dtype",
    ]
    assert "/models/policy-base: no such folder" in problems[0]
    assert "bfloat16 is for a GPU" in problems[1]
    assert preflight(preset, gpu=True) == problems[:1]  # on a GPU machine, only the checkpoint


def test_a_folder_without_config_json_is_not_a_checkpoint(tmp_path):
    (tmp_path / "ckpt").mkdir()
    preset = load_preset(_copy("cpu-pretrained.yaml", tmp_path,
                               policy={"pretrained_path": str(tmp_path / "ckpt")}))  # fmt: skip
    assert any("not a checkpoint (no config.json)" in p for p in preflight(preset))
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    assert not any("pretrained_path" in p for p in preflight(preset))


def test_a_cluster_preset_without_cluster_access_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    preset = load_preset(_copy("gpu-cluster.yaml", tmp_path))
    (problem,) = preflight(preset)
    assert problem.startswith(f"{preset.path}:launcher: mode kubernetes needs cluster access")
    # a kube config that is not one (what gave "internal error ConfigException")
    (tmp_path / "kubeconfig").write_text("clusters: []\nusers: []\ncontexts: []\n")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    (problem,) = preflight(preset)
    assert problem.startswith(f"{preset.path}:launcher: mode kubernetes: the kube config is "
                              "unusable:")  # fmt: skip
    # the paths of a cluster run are on the cluster's volume: not looked for here
    assert "pretrained_path" not in problem


def test_a_cluster_that_does_not_answer_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    preset = load_preset(_copy("gpu-cluster.yaml", tmp_path,
                               launcher={"api_url": "http://127.0.0.1:9"}))  # fmt: skip
    (problem,) = preflight(preset)
    assert problem.startswith(f"{preset.path}:launcher: cannot reach the cluster at "
                              "http://127.0.0.1:9")  # fmt: skip


def test_home_that_is_not_a_writable_folder_is_named_before_prefect(monkeypatch):
    """45 finding 11: HOME=/dev/null gave "Prefect API server exited before it answered"."""
    preset = load_preset(ROOT / "configs" / "cpu-demo.yaml")
    monkeypatch.setenv("HOME", "/dev/null")
    (line,) = [p for p in preflight(preset, gpu=False) if p.startswith("HOME")]
    assert line.startswith("HOME (/dev/null) is not a writable folder")
    monkeypatch.setenv("HOME", str(ROOT))
    assert not [p for p in preflight(preset, gpu=False) if p.startswith("HOME")]
