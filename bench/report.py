"""What a bench does with its table: print it, and write it to OUT/<name>-<date>.md."""

from __future__ import annotations

import datetime
from pathlib import Path


def write_table(text: str, out: Path, name: str) -> Path:
    """Print `text`, write it to out/<name>-<today>.md (folders made), return the path."""
    print(text)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{datetime.date.today().isoformat()}.md"
    path.write_text(text)
    print(f"written to {path}")
    return path
