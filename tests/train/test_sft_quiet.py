"""SFT prints none of its libraries' internals where every print is logged.

Under Prefect's `log_prints` (`make run`) every `print(file=None)` goes to the run log, also
one a library meant to capture: dill disassembles functions into a swapped `sys.stdout`
while `datasets` fingerprints a table or a map function, and that bytecode listing used to
fill the log during SFT.
"""

from __future__ import annotations

import builtins
import re

from components.train.config import SFTConfig
from components.train.sft import train_sft


def test_sft_prints_no_bytecode_under_log_prints(
    tiny_policy, expert_records, tmp_path, monkeypatch
):
    model, tokenizer = tiny_policy
    printed: list[str] = []
    real_print = builtins.print

    def log_prints(*args, **kwargs):  # prefect.logging.loggers.print_as_log's routing
        if kwargs.get("file") is None:
            printed.append(" ".join(map(str, args)))
        real_print(*args, **kwargs)

    monkeypatch.setattr(builtins, "print", log_prints)
    config = SFTConfig(max_steps=1, batch_size=2, max_seq_len=768, seed=0, use_cpu=True,
                       output_dir=str(tmp_path / "sft"))  # fmt: skip
    train_sft(model, tokenizer, expert_records, config)
    assert not [line for line in printed if re.search(r"\b(LOAD_\w+|RETURN_VALUE)\b", line)]
