"""reproduce: rerun a registered model version's pipeline and say whether it comes out the same.

    .venv/bin/agentrl reproduce VERSION          (or: python -m flows.reproduce VERSION)

Reads the version's lineage (git commit, preset file and its config hash, data version, and
the fingerprints of its stages: SFT weights, candidate weights, evaluation outcomes),
checks that this checkout can reproduce it (same commit, same preset content), checks its
data version out (every object verified; edits to data/ that no version holds are
refused, not dropped), then runs the retrain flow's stages from a clean cache in
its work folder (same preset, nothing registered), logged to MLflow as a reproduction
of the original run. It reports `equal`, or `differs` with the first stage whose output
differs (data, SFT, RL, eval). Exit status 0 for equal, 1 for differs, 2 when it cannot
reproduce at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Compared in pipeline order: the first one that differs is where the runs parted.
STAGES = (
    ("data", "data_version"),
    ("SFT", "sft_sha256"),
    ("RL", "weights_sha256"),
    ("eval", "eval_digest"),
)


def resolve_version(ref: str, config) -> str:
    """The version number `ref` names: itself, or the version its alias points at
    (`champion`, `challenger`, ...); ValueError naming the aliases there are."""
    from components.promote.registry import get_aliases

    if str(ref).isdigit():
        return str(ref)
    aliases = get_aliases(config)
    if ref not in aliases:
        there = ", ".join(f"{a} -> v{v}" for a, v in sorted(aliases.items())) or "none"
        store = config.resolved_tracking_uri()
        raise ValueError(f"model {config.model_name} in the MLflow store {store} has no alias "
                         f"{ref!r} (aliases: {there})")  # fmt: skip
    return aliases[ref]


def lineage_of(version: str, preset_path: str | None = None) -> dict:
    """The registered version's tags (those a reproduction needs are checked here);
    `version` is a number (an alias is resolved first, `resolve_version`)."""
    from components.preset import DEFAULT_PRESET, load_preset
    from components.promote.registry import get_version

    config = load_preset(preset_path or DEFAULT_PRESET).section("promote")
    tags = get_version(str(version), config)["tags"]
    missing = [k for k in ("git_commit", "config_hash", "preset", *dict(STAGES).values())
               if not tags.get(k)]  # fmt: skip
    if missing:
        raise ValueError(
            f"version {version} has no {', '.join(missing)} in its lineage "
            "(registered before reproductions were recorded): it cannot be reproduced"
        )
    return tags


def preconditions(tags: dict) -> list[str]:
    """Why this checkout cannot reproduce the version ([] when it can)."""
    from components.preset import load_preset
    from components.promote.registry import current_git_commit
    from flows.retrain_main import preflight

    problems = []
    head = current_git_commit()
    if tags["git_commit"] != head:
        problems.append(f"code: registered at commit {tags['git_commit'][:12]}, this checkout "
                        f"is {head[:12]} (check that commit out first)")  # fmt: skip
    try:
        run_preset = load_preset(tags["preset"])
        found = run_preset.config_hash()
    except Exception as e:  # noqa: BLE001 - any unreadable preset is a reason to stop
        problems.append(f"preset: {e}")
    else:
        if found != tags["config_hash"]:
            problems.append(f"preset: {tags['preset']} has config hash {found}, the version "
                            f"was trained with {tags['config_hash']}")  # fmt: skip
        # what the preset names outside itself, before the data checkout writes anything
        problems += [f"preflight: {p}" for p in preflight(run_preset)]
    return problems


def checkout_data(data_version: str, preset: str) -> str | None:
    """Restore data/ to the version the model was trained on (`agentrl data rollback`, which
    verifies every object of the version and refuses to drop unsnapshotted edits); the
    one-line reason when it cannot, else None."""
    import contextlib
    import io

    from components.cli import main as agentrl

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = agentrl(["data", "rollback", data_version, "--preset", preset])
    if code == 0:
        return None
    reason = err.getvalue().strip().splitlines()
    return f"data: {reason[-1] if reason else f'rollback to {data_version} failed ({code})'}"


def compare(registered: dict, reproduced: dict) -> dict:
    """{'verdict': 'equal' | 'differs', 'first_difference': stage or None, 'stages': ...}"""
    rows = []
    for stage, key in STAGES:
        rows.append({"stage": stage, "key": key, "registered": registered.get(key),
                     "reproduced": reproduced.get(key),
                     "equal": registered.get(key) == reproduced.get(key)})  # fmt: skip
    first = next((r["stage"] for r in rows if not r["equal"]), None)
    return {"verdict": "equal" if first is None else "differs", "first_difference": first,
            "stages": rows}  # fmt: skip


def reproduce(version: str, preset: str | None = None) -> dict:
    """Check, rerun from a clean cache, compare. `preset` only says where to find the
    registry (default: the shipped preset's promote section); the run uses the version's
    own preset, in its own work folder: paths are part of what stages record (a dataset
    keeps the name of the file it was ingested from), so the rerun writes where the original
    did, with the original's folder moved aside and put back afterwards; the rerun's
    artefacts end in runs/reproduce-vN. From the data checkout to the folder's return it
    holds the workdir's and data repository's locks: a pipeline running there refuses it
    (WorkdirInUse), and it refuses a pipeline started meanwhile. `version` may be an alias."""
    from components.preset import DEFAULT_PRESET, load_preset

    version = resolve_version(version, load_preset(preset or DEFAULT_PRESET).section("promote"))
    tags = lineage_of(version, preset)
    problems = preconditions(tags)
    if problems:
        return {"verdict": "cannot reproduce", "version": str(version), "problems": problems}
    return reproduce_locked(version, tags)


def reproduce_locked(version: str, tags: dict) -> dict:
    """Under the locks of the version's workdir and data repository (WorkdirInUse, naming
    the run that holds one, before anything is touched): its data checked out, the rerun."""
    from components.preset import load_preset
    from components.workdir_lock import pipeline_locks

    run_preset = load_preset(tags["preset"])
    with pipeline_locks(run_preset, f"agentrl reproduce {version}"):
        problem = checkout_data(tags["data_version"], tags["preset"])
        if problem:
            return {"verdict": "cannot reproduce", "version": str(version), "problems": [problem]}
        return rerun(version, tags, Path(run_preset.section("pipeline").workdir))


def rerun(version: str, tags: dict, original: Path) -> dict:
    """The retrain flow on the version's preset in `original` (its workdir; the folder
    there moved aside and put back), compared with the version's fingerprints. The flow
    gets Prefect's API as `python -m flows.retrain` gets it (`prefect_api`: health-waited
    with the preset's `runtime.startup_timeout_s`) and runs in a thread of its own so that
    Ctrl-C and SIGTERM stay with components/shutdown.py's handler."""
    from components.preset import load_preset
    from components.shutdown import forget, in_worker_thread, on_stop
    from flows.retrain_main import prefect_api

    aside = original.with_name(f"{original.name}.before-reproduce-v{version}")
    done = Path(f"runs/reproduce-v{version}")
    for folder in (aside, done):
        if folder.exists():
            raise ValueError(f"{folder} exists (an earlier reproduction?): move it away first")
    if original.exists():
        original.rename(aside)
    # Ctrl-C or SIGTERM ends the process without this function's `finally`: the original
    # folder is put back by the signal handler too (components/shutdown.py)
    key = on_stop(
        f"the workdir {original} (moved aside to {aside})", lambda: put_back(original, aside, done)
    )
    budget = load_preset(tags["preset"]).section("runtime").startup_timeout_s
    of = {"version": str(version), "run_id": tags.get("pipeline_run_id", "")}
    try:
        with prefect_api(budget):
            from flows.retrain import retrain

            summary = in_worker_thread(
                lambda: retrain(tags["preset"], request_promotion=False, reproduction_of=of)
            )
    finally:
        forget(key)
        put_back(original, aside, done)
    result = compare(tags, summary["fingerprints"])
    return {**result, "version": str(version), "run_id": summary["run_id"], "workdir": str(done),
            "original_run_id": tags.get("pipeline_run_id", "")}  # fmt: skip


def put_back(original: Path, aside: Path, done: Path) -> None:
    """The rerun's folder to `done`, the original's from `aside` back where it was."""
    done.parent.mkdir(parents=True, exist_ok=True)
    if original.exists():
        original.rename(done)
    if aside.exists():
        aside.rename(original)


def print_report(report: dict) -> None:
    print(f"\n=== Reproduction of version {report['version']} ===")
    if report["verdict"] == "cannot reproduce":
        print("cannot reproduce:")
        for p in report["problems"]:
            print(f"  - {p}")
        return
    for row in report["stages"]:
        mark = "equal " if row["equal"] else "DIFFERS"
        print(f"  [{mark}] {row['stage']:<5} {row['key']}: {row['registered']}"
              + ("" if row["equal"] else f" -> {row['reproduced']}"))  # fmt: skip
    where = f" (first at {report['first_difference']})" if report["first_difference"] else ""
    print(f"\n{report['verdict']}{where}; reproduction run {report['run_id']}, "
          f"artefacts in {report['workdir']}")  # fmt: skip
    if report.get("original_run_id"):
        from components.tracking import compare_url

        print("MLflow, the original beside its reproduction: "
              + compare_url([report["original_run_id"], report["run_id"]]))  # fmt: skip


def _version(text: str) -> str:
    """A version number (>= 1) or an alias name."""

    if text.isdigit() and int(text) < 1 or not text.strip() or text.startswith("-"):
        raise argparse.ArgumentTypeError(
            f"expected a version number >= 1 or an alias, got {text!r}"
        )
    return text


def main(argv: list[str] | None = None) -> int:
    from components.cli_args import ArgumentParser, preset_file

    p = ArgumentParser(prog="agentrl reproduce", description=__doc__.splitlines()[0])
    p.add_argument("version", type=_version, help="registered model version (number or alias)")
    p.add_argument("--preset", type=preset_file,
                   help="preset whose promote section names the registry")  # fmt: skip
    args = p.parse_args(argv)
    try:
        report = reproduce(args.version, args.preset)
    except ValueError as e:
        print(f"agentrl reproduce: {e}", file=sys.stderr)
        return 2
    print_report(report)
    Path("runs").mkdir(exist_ok=True)
    Path(f"runs/reproduce-v{report['version']}.json").write_text(json.dumps(report, indent=2))
    return {"equal": 0, "differs": 1}.get(report["verdict"], 2)


def run(argv: list[str] | None = None) -> int:
    """`python -m flows.reproduce`: `main` behind the command line's error boundary (one
    line per error; Ctrl-C and SIGTERM stop everything it started, components/shutdown.py),
    as `agentrl reproduce` has it."""
    from components.cli import boundary, cpu_accelerator_default

    cpu_accelerator_default()
    argv = list(sys.argv[1:] if argv is None else argv)
    return boundary(lambda: main(argv), "agentrl reproduce", debug="--debug" in argv)


if __name__ == "__main__":
    sys.exit(run())
