"""Presets the parser must bound (issue 45, item 5): a 480-byte YAML alias bomb, a 10000-deep
document and numbers beyond what the machine can do are each one line naming the preset (and
the field), exit 2, well within a second of parsing; no hang, no internal error."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.preset import PresetError, load_preset, validate_preset

ROOT = Path(__file__).resolve().parents[1]

LOL = '"lol"'


def _alias_bomb() -> str:
    """Nine levels of nine aliases each under a real section: 9**9 strings once expanded."""
    lines = ["name: bomb", "evaluate:", f"  a0: &a0 [{','.join([LOL] * 9)}]"]
    lines += [f"  a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


def test_the_alias_bomb_is_about_480_bytes():
    assert 400 <= len(_alias_bomb()) <= 520


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_alias_bomb(), "aliases expand this preset beyond"),
        ("name: deep\ntasks: " + "[" * 10000 + "]" * 10000 + "\n", "maximum nesting depth"),
        ("name: deep\ntasks: " + "[" * 40 + "]" * 40 + "\n", "nested deeper than 32"),
        ("name: x\nsft: &s {max_steps: [*s]}\n", "a recursive or undefined alias"),
    ],
    ids=["alias-bomb", "10000-deep", "40-deep", "recursive-alias"],
)
def test_a_hostile_document_is_refused_at_once_naming_the_preset(tmp_path, text, expected):
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    started = time.monotonic()
    with pytest.raises(PresetError) as refused:
        load_preset(path)
    assert time.monotonic() - started < 0.5
    message = str(refused.value)
    assert message.startswith(f"{path}:") and expected in message and "\n" not in message


def test_a_legitimate_alias_still_loads(tmp_path):
    path = tmp_path / "alias.yaml"
    path.write_text("name: ok\nsft: {lora: &lora {r: 8, alpha: 16}}\ndpo: {lora: *lora}\n")
    preset = load_preset(path)
    validate_preset(preset)
    assert preset.raw("dpo")["lora"] == {"r": 8, "alpha": 16}


@pytest.mark.parametrize(
    ("n_tasks", "expected"),
    [
        (str(10**32), f"tasks.n_tasks: {10**32} is beyond what this machine can count"),
        (str(10**12), "tasks.n_tasks: 1000000000000 tasks need at least"),
        ("9" * 5000, "a number longer than Python reads"),
    ],
    ids=["1e32", "1e12-more-than-the-disk", "5000-digits"],
)
def test_a_count_beyond_the_machine_is_refused_with_the_field_named(tmp_path, n_tasks, expected):
    path = tmp_path / "big.yaml"
    path.write_text(f"name: big\ntasks: {{n_tasks: {n_tasks}}}\n")
    with pytest.raises(PresetError, match=expected):
        validate_preset(load_preset(path))


def test_a_preset_larger_than_a_mib_is_not_read_whole(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text("name: huge\n" + "# padding\n" * 200_000)
    with pytest.raises(PresetError, match="larger than 1 MiB"):
        load_preset(path)


@pytest.mark.parametrize("kind", ["alias-bomb", "10000-deep", "1e32"])
def test_the_command_line_answers_one_line_exit_2(tmp_path, kind):
    text = {"alias-bomb": _alias_bomb(),
            "10000-deep": "name: deep\ntasks: " + "[" * 10000 + "]" * 10000 + "\n",
            "1e32": "name: big\ntasks: {n_tasks: 100000000000000000000000000000000}\n"}[kind]  # fmt: skip
    (tmp_path / "p.yaml").write_text(text)
    result = subprocess.run([sys.executable, "-m", "components.cli", "tasks", "generate",
                             "--preset", "p.yaml", "--out", "suite"], cwd=tmp_path,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "p.yaml" in line and "internal error" not in line
    assert not (tmp_path / "suite").exists()


def test_a_count_flag_beyond_the_machine_is_refused(tmp_path):
    result = subprocess.run([sys.executable, "-m", "components.cli", "tasks", "generate",
                             "--n", str(10**32), "--out", "suite"], cwd=tmp_path,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2 and "beyond what this machine can count" in result.stderr
    assert not (tmp_path / "suite").exists()
