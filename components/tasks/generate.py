"""The built-in generated coding-task suite.

For each task: render a correct module from a family (families.py), inject one bug with an
AST operator (mutations.py), pre-screen the mutant in-process (it must fail at least one
case, must not loop, must differ from every other task's bug), compute expected values by
running the correct code, and write a task folder (task.py) whose visible tests fail on
the bug and whose hidden tests are thorough.

Splits: families are partitioned once (by a salted hash of their name, independent of the
seed) into train families and test families. `train` and `val` tasks both come from train
families but are distinct bug instances (different rng stream, and every task's buggy
module is unique in the suite); `test` tasks come only from test families
(out-of-distribution). Same seed and config => byte-identical folders.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import hashlib
import json
import random
import shutil
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from components.output_files import disk_errors, start_outputs
from components.tasks.families import FAMILIES, Family, Variant, render
from components.tasks.mutations import OPERATORS, Mutant, Operator, apply_edit, count_edits
from components.tasks.task import (
    DEFAULT_TEST_COMMAND,
    HIDDEN_CASES_FILE,
    TaskMetadata,
    write_task_folder,
)
from components.typed_config import doc

GENERATOR = "agentrl-builtin/1"
PROTECTED_PATHS = ("tests/", "pyproject.toml", "conftest.py", "pytest.ini", "tox.ini", "setup.cfg")
# Pins pytest's rootdir/config to the task repo (so an enclosing project's pytest settings
# never leak in) and makes the module importable however pytest is launched.
REPO_PYPROJECT = '[tool.pytest.ini_options]\npythonpath = ["."]\n'


@dataclass(frozen=True)
class GenerateConfig:
    n_tasks: int = field(default=300, metadata=doc("number of tasks to generate", ge=1))
    seed: int = field(
        default=0, metadata=doc("generation seed; same seed and config => same bytes")
    )
    train_fraction: float = field(
        default=0.6, metadata=doc("share of tasks in the train split", ge=0.0, le=1.0)
    )
    val_fraction: float = field(
        default=0.2,
        metadata=doc(
            "share of tasks in val (new bugs of train families); test gets the rest", ge=0.0, le=1.0
        ),
    )
    test_family_fraction: float = field(
        default=0.25,
        metadata=doc(
            "share of families held out for the test split (never in train/val)", ge=0.0, le=1.0
        ),
    )
    family_split_salt: str = field(
        default="agentrl-families-v1",
        metadata=doc("salt of the hash that partitions families; change to re-draw"),
    )
    families: tuple[str, ...] | None = field(
        default=None, metadata=doc("restrict to these family names (None: all)")
    )
    operators: tuple[str, ...] | None = field(
        default=None, metadata=doc("restrict to these mutation operators (None: all)")
    )
    visible_failing: int = field(
        default=2, metadata=doc("failing cases shown in the visible tests (at least 1)", ge=1)
    )
    visible_passing: int = field(
        default=2, metadata=doc("passing cases added to the visible tests", ge=0)
    )
    min_cases: int = field(
        default=5, metadata=doc("a rendered variant needs at least this many usable cases", ge=1)
    )
    step_budget: int = field(
        default=20_000,
        metadata=doc(
            "trace events allowed per call when screening (rejects looping mutants)", ge=1
        ),
    )
    max_attempts: int = field(
        default=20, metadata=doc("re-renders of a family before giving up on a task", ge=1)
    )
    max_sites_per_operator: int = field(
        default=12, metadata=doc("candidate sites tried per operator and render", ge=1)
    )


@dataclass
class GenerateReport:
    out_dir: str
    seed: int
    n_tasks: int
    by_split: dict[str, int]
    by_family: dict[str, int]
    by_operator: dict[str, int]
    by_split_family: dict[str, dict[str, int]]
    family_partition: dict[str, list[str]]
    rejected: dict[str, int]  # screened-out mutants by reason
    task_ids: list[str]
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def summary_line(self) -> str:
        splits = ", ".join(f"{k}={v}" for k, v in self.by_split.items())
        return (
            f"{self.n_tasks} tasks ({splits}) from {len(self.by_family)} families and "
            f"{len(self.by_operator)} bug classes in {self.seconds:.1f}s"
        )


@dataclass(frozen=True)
class BuiltTask:
    """Everything needed to write one task folder (in memory; nothing executed later)."""

    task_id: str
    split: str
    variant: Variant
    mutant: Mutant
    visible: list[tuple[tuple, object]]
    hidden: list[tuple[tuple, object]]


# ---------------------------------------------------------------------------- screening


class NoMutantError(RuntimeError):
    """No operator (of those allowed) yields a valid bug for a family."""


class _BudgetExceeded(BaseException):
    """Raised inside screened code; BaseException so that `except Exception` can't eat it."""


TIMEOUT = object()


def call_with_budget(func, args: tuple, budget: int):
    """func(*args) under a trace-event budget -> ('ok', value) | ('error', name) | TIMEOUT.

    The budget counts Python call/line events, so it stops pure-Python infinite loops in
    any thread (signal.alarm would only work in the main thread). Unbounded recursion ends
    in RecursionError, reported as an error like any other crash."""
    steps = 0

    def tracer(frame, event, arg):
        nonlocal steps
        steps += 1
        if steps > budget:
            raise _BudgetExceeded
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        return ("ok", func(*_fresh(args)))
    except _BudgetExceeded:
        return TIMEOUT
    except Exception as e:  # the bug may crash; that is a failing case
        return ("error", type(e).__name__)
    finally:
        sys.settrace(previous)


def _fresh(args: tuple) -> tuple:
    # Tests pass fresh literals on every call; mirror that so in-place mutation can't leak.
    return ast.literal_eval(repr(args))


def load_function(source: str, module: str, function: str):
    namespace: dict = {"__name__": module}
    exec(compile(source, f"{module}.py", "exec"), namespace)
    return namespace[function]


def _is_literal(value) -> bool:
    try:
        text = repr(value)
        back = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return back == value and repr(back) == text


def _matches(result, expected) -> bool:
    # Same semantics as the written assertion (see _assertion).
    if expected is None or isinstance(expected, bool):
        return result is expected
    try:
        return bool(result == expected)
    except Exception:
        return False


def expected_cases(variant: Variant, budget: int) -> list[tuple[tuple, object]]:
    """(args, expected) for every case the correct code handles; deduplicated, in order."""
    func = load_function(variant.source, variant.module, variant.function)
    out, seen = [], set()
    for args in variant.cases:
        key = repr(args)
        if key in seen or not _is_literal(args):
            continue
        seen.add(key)
        outcome = call_with_budget(func, args, budget)
        if outcome is TIMEOUT or outcome[0] != "ok" or not _is_literal(outcome[1]):
            continue  # the spec does not cover this input; don't test it
        out.append((args, outcome[1]))
    return out


def screen_mutant(
    mutant_source: str, variant: Variant, cases: list[tuple[tuple, object]], budget: int
) -> tuple[str, list[int]]:
    """('ok', failing case indices) or (reason, []) with reason timeout|equivalent|broken."""
    try:
        func = load_function(mutant_source, variant.module, variant.function)
    except Exception:
        return "broken", []
    failing = []
    for i, (args, expected) in enumerate(cases):
        outcome = call_with_budget(func, args, budget)
        if outcome is TIMEOUT:
            return "timeout", []
        if outcome[0] != "ok" or not _matches(outcome[1], expected):
            failing.append(i)
    if not failing:
        return "equivalent", []
    return "ok", failing


# ---------------------------------------------------------------------------- partition


def partition_families(
    families: list[Family], test_fraction: float, salt: str
) -> tuple[list[Family], list[Family]]:
    """(train families, test families): a stable split that does not depend on the seed."""

    def key(f: Family) -> str:
        return hashlib.sha256(f"{salt}:{f.name}".encode()).hexdigest()

    ranked = sorted(families, key=key)
    n_test = max(1, round(len(ranked) * test_fraction)) if len(ranked) > 1 else 0
    test = sorted(ranked[:n_test], key=lambda f: f.name)
    train = sorted(ranked[n_test:], key=lambda f: f.name)
    return train, test


def split_sizes(n_tasks: int, cfg: GenerateConfig) -> dict[str, int]:
    n_train = round(n_tasks * cfg.train_fraction)
    n_val = round(n_tasks * cfg.val_fraction)
    n_train = min(n_train, n_tasks)
    n_val = min(n_val, n_tasks - n_train)
    return {"train": n_train, "val": n_val, "test": n_tasks - n_train - n_val}


def _schedule(families: list[Family], n: int, seed: int, split: str) -> list[Family]:
    """n families cycling through a freshly shuffled order each round (balanced counts)."""
    out: list[Family] = []
    r = 0
    while len(out) < n:
        order = list(families)
        random.Random(f"{seed}/{split}/schedule/{r}").shuffle(order)
        out.extend(order)
        r += 1
    return out[:n]


# ---------------------------------------------------------------------------- building


@dataclass
class _Tally:
    """What the suite has built so far: each operator's use (bug classes stay balanced),
    the mutants taken (none twice) and why candidates were rejected."""

    op_counts: Counter = field(default_factory=Counter)
    used: set[str] = field(default_factory=set)
    rejected: Counter = field(default_factory=Counter)


def _build_one(
    task_id: str,
    split: str,
    family: Family,
    rng: random.Random,
    operators: list[Operator],
    tally: _Tally,
    cfg: GenerateConfig,
) -> BuiltTask:
    op_counts, used, rejected = tally.op_counts, tally.used, tally.rejected
    for _ in range(cfg.max_attempts):
        variant = render(family, rng)
        cases = expected_cases(variant, cfg.step_budget)
        if len(cases) < cfg.min_cases:
            raise ValueError(
                f"family {family.name}: only {len(cases)} usable cases (need {cfg.min_cases})"
            )
        # Least-used operator first keeps bug classes balanced within the suite.
        ranked = sorted(operators, key=lambda op: (op_counts[op.name], rng.random()))
        for op in ranked:
            sites = list(range(count_edits(variant.source, op)))
            rng.shuffle(sites)
            for k in sites[: cfg.max_sites_per_operator]:
                mutant = apply_edit(variant.source, op, k)
                if mutant is None:
                    rejected["no_change"] += 1
                    continue
                key = hashlib.sha256(mutant.source.encode()).hexdigest()
                if key in used:
                    rejected["duplicate"] += 1
                    continue
                verdict, failing = screen_mutant(mutant.source, variant, cases, cfg.step_budget)
                if verdict != "ok":
                    rejected[verdict] += 1
                    continue
                used.add(key)
                op_counts[op.name] += 1
                return BuiltTask(
                    task_id, split, variant, mutant, _pick_visible(cases, failing, rng, cfg), cases
                )
    raise NoMutantError(f"{task_id}: no valid mutant for family {family.name}")


def _pick_visible(cases, failing: list[int], rng: random.Random, cfg: GenerateConfig):
    failing_set = set(failing)
    passing = [i for i in range(len(cases)) if i not in failing_set]
    chosen = rng.sample(failing, min(max(1, cfg.visible_failing), len(failing)))
    chosen += rng.sample(passing, min(cfg.visible_passing, len(passing)))
    return [cases[i] for i in sorted(chosen)]


def _assertion(function: str, args: tuple, expected) -> str:
    call = f"{function}({', '.join(repr(a) for a in args)})"
    if expected is None or isinstance(expected, bool):
        return f"assert {call} is {expected!r}"
    return f"assert {call} == {expected!r}"


def render_test_file(module: str, function: str, cases, hidden: bool) -> str:
    lines = [f"from {module} import {function}", ""]
    for i, (args, expected) in enumerate(cases, 1):
        name = f"test_{function}_{'hidden_' if hidden else ''}{i}"
        lines += ["", f"def {name}():", f"    {_assertion(function, args, expected)}", ""]
    return "\n".join(lines)


def unified_diff(rel_path: str, old: str, new: str) -> str:
    """git-style unified diff of one file (applies with `patch -p1` and `git apply`)."""
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{rel_path}",
            tofile=f"b/{rel_path}",
        )
    )


def instruction_text(module: str, test_command: tuple[str, ...]) -> str:
    return (
        f"The unit tests in tests/test_{module}.py fail. Run `{' '.join(test_command)}` to "
        f"see the failures, then fix the bug in {module}.py so that all tests pass. "
        "Do not modify the tests."
    )


def write_built_task(root: Path, built: BuiltTask, seed: int, family_split: str) -> None:
    v, m = built.variant, built.mutant
    module_file = f"{v.module}.py"
    buggy, correct = m.source + "\n", v.source + "\n"
    write_task_folder(
        root,
        task_id=built.task_id,
        instruction=instruction_text(v.module, DEFAULT_TEST_COMMAND),
        metadata=TaskMetadata(
            family=v.family,
            bug_class=m.operator,
            split=built.split,
            source="builtin",
            extra={
                "generator": GENERATOR,
                "seed": seed,
                "module": module_file,
                "function": v.function,
                "mutation": m.description,
                "mutation_line": m.lineno,
                "family_split": family_split,
                "n_visible_cases": len(built.visible),
                "n_hidden_cases": len(built.hidden),
            },
        ),
        repo_files={
            module_file: buggy,
            f"tests/test_{v.module}.py": render_test_file(
                v.module, v.function, built.visible, False
            ),
            "pyproject.toml": REPO_PYPROJECT,
        },
        hidden_test_files={
            f"tests/test_{v.module}_hidden.py": render_test_file(
                v.module, v.function, built.hidden, True
            )
        },
        reference_patch=unified_diff(module_file, buggy, correct),
        test_command=DEFAULT_TEST_COMMAND,
        protected_paths=PROTECTED_PATHS,
    )
    # The same hidden cases as data, for the verifier's out-of-process comparison (the
    # expected values never enter the sandbox there; see components/verifier/verdict.py).
    cases = {
        "module": module_file,
        "function": v.function,
        "cases": [{"args": repr(tuple(a)), "expected": repr(e)} for a, e in built.hidden],
    }
    (root / HIDDEN_CASES_FILE).write_text(json.dumps(cases, indent=1) + "\n")


def build_suite(cfg: GenerateConfig) -> tuple[list[BuiltTask], dict]:
    """All tasks in memory plus bookkeeping (partition, rejections); no files written."""
    n_tasks, seed = cfg.n_tasks, cfg.seed
    families = [f for f in FAMILIES if cfg.families is None or f.name in cfg.families]
    operators = [op for op in OPERATORS if cfg.operators is None or op.name in cfg.operators]
    if cfg.families is not None and len(families) != len(set(cfg.families)):
        unknown = set(cfg.families) - {f.name for f in families}
        raise ValueError(f"unknown families: {sorted(unknown)}")
    if cfg.operators is not None and len(operators) != len(set(cfg.operators)):
        unknown = set(cfg.operators) - {op.name for op in operators}
        raise ValueError(f"unknown operators: {sorted(unknown)}")
    train_fams, test_fams = partition_families(
        families, cfg.test_family_fraction, cfg.family_split_salt
    )
    sizes = split_sizes(n_tasks, cfg)
    if sizes["test"] and not test_fams:
        raise ValueError("the test split needs at least two families")
    tally = _Tally()
    rejected = tally.rejected
    built: list[BuiltTask] = []
    for split in ("train", "val", "test"):
        pool = test_fams if split == "test" else train_fams
        for i, family in enumerate(_schedule(pool, sizes[split], seed, split), 1):
            task_id = f"{split}-{i:04d}"
            # A family may have no valid bug under a restricted operator set: fall back to
            # the next families of the pool (deterministic order), and count the skip.
            start = pool.index(family)
            for candidate in pool[start:] + pool[:start]:
                rng = random.Random(f"{seed}/{split}/{i}")
                try:
                    built.append(
                        _build_one(
                            task_id,
                            split,
                            candidate,
                            rng,
                            operators,
                            tally,
                            cfg,
                        )
                    )
                    break
                except NoMutantError:
                    rejected[f"family_without_mutant:{candidate.name}"] += 1
            else:
                raise NoMutantError(f"{task_id}: no family of the {split} pool yields a bug")
    partition = {"train": [f.name for f in train_fams], "test": [f.name for f in test_fams]}
    return built, {"partition": partition, "rejected": dict(sorted(rejected.items()))}


def _report(out: Path, cfg: GenerateConfig, built: list, info: dict) -> GenerateReport:
    by_split = Counter(b.split for b in built)
    by_family = Counter(b.variant.family for b in built)
    by_operator = Counter(b.mutant.operator for b in built)
    by_split_family: dict[str, dict[str, int]] = {}
    for b in built:
        d = by_split_family.setdefault(b.split, {})
        d[b.variant.family] = d.get(b.variant.family, 0) + 1
    return GenerateReport(
        out_dir=str(out),
        seed=cfg.seed,
        n_tasks=len(built),
        by_split={s: by_split.get(s, 0) for s in ("train", "val", "test")},
        by_family=dict(sorted(by_family.items())),
        by_operator=dict(sorted(by_operator.items())),
        by_split_family={s: dict(sorted(d.items())) for s, d in sorted(by_split_family.items())},
        family_partition=info["partition"],
        rejected=info["rejected"],
        task_ids=[b.task_id for b in built],
    )


def _suite_manifest(cfg: GenerateConfig, built: list, report: GenerateReport) -> dict:
    """suite.json: the config, the family partition, counts and every task's mutation."""
    return {
        "generator": GENERATOR,
        "seed": cfg.seed,
        "n_tasks": len(built),
        "config": asdict(cfg),
        "family_partition": report.family_partition,
        "counts": {
            "split": report.by_split,
            "family": report.by_family,
            "operator": report.by_operator,
            "split_family": report.by_split_family,
        },
        "rejected_mutants": report.rejected,
        "tasks": {
            b.task_id: {
                "family": b.variant.family,
                "bug_class": b.mutant.operator,
                "split": b.split,
                "mutation": b.mutant.description,
            }
            for b in built
        },
    }


def generate_suite(
    out_dir: str | Path,
    n_tasks: int | GenerateConfig | None = None,
    seed: int | None = None,
    config: GenerateConfig | None = None,
    *,
    overwrite: bool = False,
) -> GenerateReport:
    """Write the suite's task folders (out_dir/<task_id>/) and out_dir/suite.json.

    Call as generate_suite(out, 300, 0) or generate_suite(out, GenerateConfig(...));
    explicit n_tasks/seed override the config's. Refuses a non-empty out_dir unless
    overwrite=True and it holds a previous suite (has suite.json), which is then replaced.
    """
    if isinstance(n_tasks, GenerateConfig):
        config, n_tasks = n_tasks, None
    cfg = config or GenerateConfig()
    if n_tasks is not None:
        cfg = dataclasses.replace(cfg, n_tasks=n_tasks)
    if seed is not None:
        cfg = dataclasses.replace(cfg, seed=seed)
    n_tasks, seed = cfg.n_tasks, cfg.seed
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not (overwrite and (out / "suite.json").is_file()):
            raise FileExistsError(
                f"{out}: not empty (pass overwrite=True to replace a previous generated suite)"
            )
        shutil.rmtree(out)
    start = time.monotonic()
    built, info = build_suite(cfg)
    # The output manifest first, listing every folder about to be written: a run that
    # fails half-way (a full disk) leaves a folder `--overwrite` recognises as agentrl's.
    start_outputs(out, [*(b.task_id for b in built), "suite.json"])
    test_families = set(info["partition"]["test"])
    for b in built:
        family_split = "test" if b.variant.family in test_families else "train"
        with disk_errors(out / b.task_id, f"task {b.task_id}"):
            write_built_task(out / b.task_id, b, seed, family_split)

    report = _report(out, cfg, built, info)
    suite = _suite_manifest(cfg, built, report)
    with disk_errors(out / "suite.json", "the suite's manifest"):
        (out / "suite.json").write_text(json.dumps(suite, indent=2, sort_keys=True) + "\n")
    report.seconds = round(time.monotonic() - start, 3)
    return report
