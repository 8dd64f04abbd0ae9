"""What every stage command that owns an output folder shares: its parser (`--preset`,
`--out`), reading canonical records, claiming the folder before the work and marking it
started, its preset sections, and writing its `result.json`. A stage folder is resumed, not
refused, by the next run of the same stage.
"""

from __future__ import annotations

import json
from pathlib import Path

from components.cli_args import ArgumentParser, CommandError, output_dir, preset_file
from components.outputs import MANIFEST, check_output_dir, record_outputs, write_atomic
from components.preset import DEFAULT_PRESET


def read_records(sources: list[str]) -> list[dict]:
    """Canonical records from JSONL files or ingested/validated dataset folders."""
    from components.data.ingest import load_records

    records: list[dict] = []
    for src in map(Path, sources):
        if src.is_dir() and (src / "manifest.json").exists():
            records.extend(load_records(src))
        elif src.is_dir() and (src / "samples.jsonl").exists():
            records.extend(_jsonl(src / "samples.jsonl"))
        elif src.is_file():
            records.extend(_jsonl(src))
        else:
            raise CommandError(f"no records at {src} (a .jsonl file or a dataset folder)")
    return records


def _jsonl(path: Path) -> list[dict]:
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise CommandError(f"{path}:{number}: not a JSON record ({e.msg})") from None
    return records


def stage_parser(prog: str, doc: str) -> ArgumentParser:
    """A stage command's parser with the options every stage has: --preset and --out."""
    p = ArgumentParser(prog=prog, description=doc)
    p.add_argument("--preset", default=DEFAULT_PRESET, type=preset_file,
                   help="preset YAML (configs/)")  # fmt: skip
    p.add_argument("--out", required=True, type=output_dir,
                   help="output folder (empty, or a previous run of this stage: it resumes)")  # fmt: skip
    return p


def claim_stage_dir(out: Path) -> None:
    """Before any work: `out` is empty, or this stage's own folder (it carries the output
    manifest from its start, or a finished run's result.json), which the stage resumes or
    rewrites; a folder holding anything else is refused with what it holds."""
    ours = (out / MANIFEST).is_file() or (out / "result.json").is_file()
    if out.is_dir() and any(out.iterdir()) and not ours:
        check_output_dir(out, overwrite=True, what="stage output")


def start_stage_dir(out: Path) -> None:
    """Mark `out` as this stage's folder once its inputs are read, before the long work:
    a run killed now is resumed, not refused, by the next."""
    from components.output_files import made_folder

    with made_folder(out):  # a manifest that cannot be written leaves no folder behind
        if not (out / MANIFEST).is_file():
            write_atomic(out / MANIFEST, '{"entries": []}\n')


def write_stage_result(out: Path, result: dict) -> int:
    """`result` as out/result.json (recorded in the folder's output manifest) and, without
    its lists (curves), as one line on stdout."""
    write_atomic(out / "result.json", json.dumps(result, indent=2, default=str) + "\n")
    record_outputs(out)
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}, default=str))
    return 0
