"""list_fixes / try_fix: candidates contain the inverse of an injected bug, tries undo each
other, tests run in the sandbox, and misuse is an error observation, never a crash."""

import ast
import difflib
import random

import pytest

from components.env.config import EnvConfig
from components.env.episode import Action, EpisodeEnv, run_episode
from components.env.final_diff import diff_changed_lines
from components.env.tool_sets import argument_errors
from components.env.tool_sets.fix_search.fixes import (
    FixListing,
    candidate_fixes,
    edit_in_place,
    listed_ids,
    operator_fixes,
    render_listing,
    summarize_test_output,
)
from components.sandbox.config import SandboxConfig
from components.scripted.reference import OraclePolicy, fixed_files
from components.scripted.registry import make_policy
from components.tasks.generate import unified_diff
from components.tasks.mutations import apply_edit, get_operator, normalize
from components.tasks.task import TaskMetadata, write_task_folder

SOURCE = normalize(
    "def clamp(x, lo, hi):\n"
    "    if x < lo:\n"
    "        return lo\n"
    "    if x > hi:\n"
    "        return hi\n"
    "    return x\n"
)


@pytest.fixture(scope="module")
def tasks(suite_tasks):
    return suite_tasks


def test_candidates_contain_the_inverse_of_each_swap():
    op = get_operator("comparison_swap")
    mutant = apply_edit(SOURCE, op, 0)  # "x < lo" changed
    assert mutant is not None
    fixes = candidate_fixes(mutant.source, limit=100)
    assert SOURCE + "\n" in [f.source for f in fixes]
    ids = [f.id for f in fixes]
    assert len(set(ids)) == len(ids) and "cmp-1" in ids  # "<kind>-<n>", unique
    assert [i for i in ids if i.startswith("cmp-")] == [f"cmp-{n}" for n in range(1, 1 + sum(
        i.startswith("cmp-") for i in ids))]  # fmt: skip
    scores = [f.score for f in fixes]
    assert scores == sorted(scores, reverse=True)  # best first
    assert len(candidate_fixes(mutant.source, limit=3)) == 3
    assert [f.id for f in candidate_fixes(mutant.source, limit=3)] == ids[:3]  # a prefix
    old = operator_fixes(mutant.source, limit=100)  # the earlier listing: reading order
    assert SOURCE + "\n" in [f.source for f in old]
    assert [f.lineno for f in old] == sorted(f.lineno for f in old)
    with pytest.raises(SyntaxError):
        candidate_fixes("def broken(:\n", limit=5)


def test_listing_groups_by_kind_and_its_ids_parse_back():
    op = get_operator("comparison_swap")
    mutant = apply_edit(SOURCE, op, 0)
    fixes = candidate_fixes(mutant.source, limit=100)
    text = render_listing(FixListing("clamp.py", mutant.source, fixes, []), "E   assert 1 == 0")
    assert text.startswith("E   assert 1 == 0\n\nCandidate fixes of clamp.py (")
    kinds = list(dict.fromkeys(f.id.rsplit("-", 1)[0] for f in fixes))
    rows = text.split("kind-number):\n", 1)[1].splitlines()
    # one line per kind, in order of first appearance; the kind opens its line
    assert [r.split(" (", 1)[0] for r in rows] == kinds
    cmp_row = next(r for r in rows if r.startswith("cmp ("))
    cmp = [f for f in fixes if f.id.startswith("cmp-")]
    assert cmp_row == f"cmp ({len(cmp)}): " + " | ".join(
        f"{n}) {f.description}" for n, f in enumerate(cmp, 1)
    )
    assert sorted(listed_ids(text)) == sorted(f.id for f in fixes)
    assert listed_ids("no listing here") == []


def test_summarize_keeps_failure_lines_and_summary():
    out = (
        "F\n=================================== FAILURES ===================================\n"
        ">       assert clamp(5, 0, 3) == 3\nE       assert 5 == 3\n"
        "tests/test_c.py:4: AssertionError\nFAILED tests/test_c.py::test_hi - assert 5 == 3\n"
        "1 failed in 0.01s\n"
    )
    text = summarize_test_output(out)
    assert "E       assert 5 == 3" in text and "FAILED tests/test_c.py::test_hi" in text
    assert "=====" not in text.splitlines()[0]
    assert summarize_test_output("") == "(no test output)"


def test_tool_specs_validate_fix_arguments():
    assert argument_errors("try_fix", {"id": "cmp-2"}) == []
    assert argument_errors("try_fix", {"id": 2})
    assert argument_errors("try_fix", {})
    assert argument_errors("list_fixes", {}) == []


def test_oracle_through_fixes_succeeds_and_runs_tests(tasks):
    covered = 0
    for task in tasks[:6]:
        policy = OraclePolicy(style="fixes", fallback=False)
        listed = policy._fixes_plan(task.id, fixed_files(task), random.Random(0)) is not None
        result = run_episode(task, policy, EnvConfig(tool_set="fix_search"), SandboxConfig())
        actions = [e["action"] for e in result.record["trajectory"] if e["role"] == "assistant"]
        assert actions[0] == "list_fixes" and result.ran_tests and result.invalid_calls == 0
        assert result.success == listed  # where the fix is listed, the oracle finds its id
        covered += listed
    assert covered >= 4  # a few bug classes (a deleted `return 'A'`) are not one edit
    fixes_only = run_episode(
        tasks[0], make_policy("oracle-fixes"), EnvConfig(tool_set="fix_search"), SandboxConfig()
    )
    assert fixes_only.record["trajectory"][1]["action"] == "list_fixes"


def test_wrong_try_is_undone_and_misuse_is_an_error(tasks):
    task = next(t for t in tasks if t.metadata.bug_class != "missing_return")
    env = EpisodeEnv(
        task, EnvConfig(tool_set="fix_search", max_steps=10), SandboxConfig(), policy_name="t"
    )
    early = env.step(Action("try_fix", {"id": "cmp-1"}))
    assert early.get("error") and "list_fixes first" in early["observation"]
    listing = env.step(Action("list_fixes", {}))
    assert "Candidate fixes of" in listing["observation"] and env.ran_tests
    bad = env.step(Action("try_fix", {"id": "nope-99"}))
    assert bad.get("error") and "no fix 'nope-99'" in bad["observation"]
    assert env.step(Action("try_fix", {"id": 3}))["error"]  # schema error, counted invalid
    assert env.invalid_calls == 1
    plan = OraclePolicy(style="fixes", recovery_rate=0.0).plan(task)
    right = next(a.arguments["id"] for a in plan if a.tool == "try_fix")
    wrong = next(c.id for c in env.tool_state.listing.candidates if c.id != right)
    assert "tests FAILED" in env.step(Action("try_fix", {"id": wrong}))["observation"]
    assert "tests FAILED" in env.step(Action("try_fix", {"id": wrong}))["observation"]  # repeat
    assert "tests PASSED" in env.step(Action("try_fix", {"id": right}))["observation"]
    env.step(Action("finish", {}))
    result = env.finish()
    assert result.success and result.changed_files == [env.tool_state.listing.path]
    # Wasted tries: before any listing, an unlisted id, and the repeat; the schema error
    # is an invalid call instead; the wrong fix failed its tests twice. Each is charged in
    # the reward and in the step that did it.
    assert result.reward_terms["wasted_fix_try"] == pytest.approx(-0.3)
    assert result.reward_terms["failed_fix_try"] == pytest.approx(-0.1)
    assert result.reward_terms["invalid_call"] == pytest.approx(-0.1)
    assert result.reward == pytest.approx(0.5)
    assert result.step_rewards == pytest.approx([-0.1, 0, -0.1, -0.1, -0.05, -0.15, 0, 0])


def test_random_fixes_policy_searches_until_pass_or_budget(tasks):
    from components.scripted.baselines import RandomFixesPolicy

    task = tasks[0]
    result = run_episode(task, RandomFixesPolicy(seed=1, max_tries=2), EnvConfig(tool_set="fix_search", max_steps=6),
                         SandboxConfig())  # fmt: skip
    actions = [e["action"] for e in result.record["trajectory"] if e["role"] == "assistant"]
    assert actions[0] == "list_fixes" and actions[-1] == "finish"
    tries = [
        e["arguments"]["id"] for e in result.record["trajectory"] if e.get("action") == "try_fix"
    ]
    assert 1 <= len(tries) <= 2 and len(set(tries)) == len(tries)
    assert result.invalid_calls == 0


def test_prior_fixes_tries_kinds_in_order_of_their_train_rates(tasks):
    from components.scripted.baselines import PriorFixesPolicy, kind_success_rates

    rates = kind_success_rates(tasks)
    # one reference fix per task is a listed candidate for most tasks: rates sum to about
    # (tasks whose fix is listed) / (candidates per kind), each in (0, 1)
    assert rates and all(0 < r < 1 for r in rates.values())
    right_kinds = set()
    for task in tasks:
        plan = OraclePolicy(style="fixes", recovery_rate=0.0).plan(task)
        right_kinds |= {a.arguments["id"].rsplit("-", 1)[0] for a in plan if a.tool == "try_fix"}
    assert max(rates, key=rates.get) in right_kinds  # the top kind has been right somewhere
    task = next(t for t in tasks if t.metadata.bug_class != "missing_return")
    result = run_episode(
        task,
        PriorFixesPolicy(rates, max_tries=3),
        EnvConfig(tool_set="fix_search"),
        SandboxConfig(),
    )
    events = result.record["trajectory"]
    tries = [e["arguments"]["id"] for e in events if e.get("action") == "try_fix"]
    assert events[1]["action"] == "list_fixes" and events[-2]["action"] == "finish"
    assert 1 <= len(tries) <= 3 and len(set(tries)) == len(tries)
    order = [rates[t.rsplit("-", 1)[0]] for t in tries]
    assert order == sorted(order, reverse=True)  # likeliest kind first
    assert result.success == ("tests PASSED" in events[-3]["observation"])


def test_listing_order_tries_one_candidate_per_kind_in_listed_order():
    from components.env.tool_sets.fix_search.fixes import listed_ids
    from components.scripted.baselines import ListingOrderPolicy

    listing = ("E   assert 1 == 2\n\nCandidate fixes of m.py (5; try_fix an id, kind-number):\n"
               "var (2): 1) line 2: a -> b | 2) line 3: b -> a\n"
               "cmp (1): 1) line 3: < -> <=\ncall (2): 1) line 4: f() -> g() | 2) line 4: x")  # fmt: skip
    assert listed_ids(listing) == ["var-1", "var-2", "cmp-1", "call-1", "call-2"]
    events = [{"role": "user", "content": "fix it"}]
    policy, tries = ListingOrderPolicy(max_tries=4), []
    while True:
        action = policy.act(None, events)
        events.append({"role": "assistant", "action": action.tool, "arguments": action.arguments})
        if action.tool == "finish":
            break
        if action.tool == "list_fixes":
            events.append({"role": "environment", "observation": listing})
            continue
        tries.append(action.arguments["id"])
        events.append({"role": "environment",
                       "observation": f"{tries[-1]} applied (x); tests FAILED\nE   no"})  # fmt: skip
    # one per kind in the listing's order, then the rest in listed order; budget of 4
    assert tries == ["var-1", "cmp-1", "call-1", "var-2"]
    # had the third try passed, the policy would finish instead of trying a fourth
    third = next(i for i, e in enumerate(events) if e.get("arguments") == {"id": "call-1"})
    passed = {"role": "environment", "observation": "call-1 applied (x); tests PASSED\n1 passed"}
    assert policy.act(None, [*events[: third + 1], passed]).tool == "finish"


def test_random_kinds_searches_kinds_in_random_order_each_in_reading_order():
    from types import SimpleNamespace

    from components.scripted.baselines import RandomFixesPolicy

    listing = ("E   assert 1 == 2\n\nCandidate fixes of m.py (5; try_fix an id, kind-number):\n"
               "var (2): 1) line 2: a -> b | 2) line 3: b -> a\n"
               "cmp (1): 1) line 3: < -> <=\ncall (2): 1) line 4: f() -> g() | 2) line 4: x")  # fmt: skip
    kinds = {"var": ["var-1", "var-2"], "cmp": ["cmp-1"], "call": ["call-1", "call-2"]}
    orders = set()
    for seed in range(12):
        policy = RandomFixesPolicy(seed=seed, max_tries=4, by_kind=True)
        events, tries = [{"role": "user", "content": "fix it"}], []
        task = SimpleNamespace(id="t")
        while (action := policy.act(task, events)).tool != "finish":
            events.append({"role": "assistant", "action": action.tool,
                           "arguments": action.arguments})  # fmt: skip
            if action.tool == "list_fixes":
                events.append({"role": "environment", "observation": listing})
                continue
            tries.append(action.arguments["id"])
            events.append({"role": "environment",
                           "observation": f"{tries[-1]} applied (x); tests FAILED\nE   no"})  # fmt: skip
        # whole kinds, each in reading order, until the budget of 4 is spent
        assert len(tries) == 4 and len(set(tries)) == 4
        order = list(dict.fromkeys(k.rsplit("-", 1)[0] for k in tries))
        assert tries == [k for kind in order for k in kinds[kind]][:4]
        orders.add(tuple(order))
    assert len({o[0] for o in orders}) == 3  # the first kind is drawn, not listed order
    # draw weights: a heavy kind is drawn first, the rest still searched after it
    heavy = RandomFixesPolicy(seed=0, max_tries=4, by_kind=True, kind_weights={"call": 1e9})
    events = [{"role": "user", "content": "fix it"},
              {"role": "assistant", "action": "list_fixes", "arguments": {}},
              {"role": "environment", "observation": listing}]  # fmt: skip
    assert heavy.act(SimpleNamespace(id="t"), events).arguments == {"id": "call-1"}


def test_kind_listing_shares_count_tasks_whose_listing_shows_the_kind(tasks):
    from components.env.tool_sets.fix_search.fixes import candidate_fixes
    from components.scripted.baselines import kind_listing_shares
    from components.scripted.reference import fixed_files

    ((before, _),) = fixed_files(tasks[0]).values()
    kinds = {c.id.rsplit("-", 1)[0] for c in candidate_fixes(before, 64)}
    assert kind_listing_shares(tasks[:1]) == dict.fromkeys(sorted(kinds), 1.0)
    ((other, _),) = fixed_files(tasks[1]).values()
    second = {c.id.rsplit("-", 1)[0] for c in candidate_fixes(other, 64)}
    both = kind_listing_shares(tasks[:2])
    assert both == {k: ((k in kinds) + (k in second)) / 2 for k in sorted(kinds | second)}


def test_stored_diff_of_try_fix_is_the_reference_fix(tasks, tmp_path):
    import shutil

    from components.evaluate.metrics import trajectory_facts
    from components.scripted.reference import fixed_files
    from components.tasks.patching import apply_unified_diff

    task = next(t for t in tasks if t.metadata.bug_class != "missing_return")
    policy = OraclePolicy(style="fixes", recovery_rate=1.0)  # a wrong try, then the fix
    result = run_episode(task, policy, EnvConfig(tool_set="fix_search"), SandboxConfig())
    assert result.success
    shutil.copytree(task.repo_dir, tmp_path / "repo")
    apply_unified_diff(tmp_path / "repo", result.final_diff)
    path, (_, after) = next(iter(fixed_files(task).items()))
    assert normalize((tmp_path / "repo" / path).read_text()) == normalize(after)
    facts = trajectory_facts(result.record)
    assert facts["failed_rerun"] and facts["setback"]
    # The deliberate wrong try is recorded as context, not as a turn to imitate.
    tries = [e for e in result.record["trajectory"] if e.get("action") == "try_fix"]
    assert [e.get("train", True) for e in tries] == [False, True]


def test_a_hanging_candidate_costs_the_per_test_timeout_not_the_wall_limit(tasks):
    import re

    task = tasks[0]
    env = EpisodeEnv(
        task,
        # a short per-test limit for the verdict too: finish() judges the looping tree
        EnvConfig(tool_set="fix_search", fix_test_timeout_s=1.0, per_test_timeout_s=1.0),
        SandboxConfig(),
        policy_name="t",
    )
    module = task.metadata.extra["module"]
    text = (env.workspace.root / module).read_text()
    head = re.search(r"^def .*:\n", text, re.MULTILINE).group(0)
    hang = text.replace(head, head + "    while True:\n        pass\n", 1)
    (env.workspace.root / module).write_text(hang)  # fix_search has no edit tool
    listing = env.step(Action("list_fixes", {}))["observation"]
    # Each looping test is stopped after 1 s of CPU time; the sandbox's wall limit (60 s,
    # "[tests timed out after ...]") is never reached, however busy the machine.
    assert "Timeout (>1s of CPU time)" in listing and "Candidate fixes of" in listing
    assert "tests timed out after" not in listing
    env.finish()


# ----------------------------------------------------------------------------- in-place edits

# Not in ast.unparse's form: comments, blank lines, a one-line `if`, a multi-line
# expression, parentheses unparse would drop, double quotes.
UNCANONICAL = '''"""Module docstring."""

# A comment at the top.


def bucket(items, k):  # trailing comment
    """Docstring."""
    counts = [0]*k   # no spaces

    for x in items:
        counts[x] += 1
        if x > k: return counts
    total = (sum(counts)
             + len(items))  # multi-line
    label = "done"
    if not (total and k):
        return None
    return max(counts), total - (k * 2), (total) // 2, f(label, k)
'''


def _changed_lines(before: str, after: str) -> list[str]:
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [ln for ln in diff if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]


def test_candidates_rewrite_only_the_lines_of_their_change():
    fixes = candidate_fixes(UNCANONICAL, limit=200)
    kinds = {f.id.rsplit("-", 1)[0] for f in fixes}
    assert {"arith", "cmp", "bool", "const", "bound", "var", "not", "del", "args", "swap",
            "call"} <= kinds  # fmt: skip
    comments = [ln for ln in UNCANONICAL.splitlines() if "#" in ln]
    spans: dict[int, int] = {}
    for node in ast.walk(ast.parse(UNCANONICAL)):
        if isinstance(node, ast.stmt) and not isinstance(node, ast.FunctionDef):
            lines = node.end_lineno - node.lineno + 1
            spans[node.lineno] = max(spans.get(node.lineno, 1), lines)
    for f in fixes:
        assert normalize(f.text) + "\n" == f.source, f.id  # the listed change, nothing else
        changed = _changed_lines(UNCANONICAL, f.text)
        # one line, or the lines of the (multi-line) statement the edit is in
        assert 1 <= len(changed) <= 2 * spans.get(f.lineno, 1), (f.id, f.description, changed)
        assert f.text.startswith('"""Module docstring."""\n\n# A comment at the top.\n\n\n')
        for line in comments:  # every comment is still there, changed or not, unless deleted
            assert line.split("#", 1)[1] in f.text or "-" + line in changed, (f.id, line)
    by_description = {f.description: f for f in fixes}
    multi = by_description["line 13: + -> -"]  # the operator of a two-line expression
    assert _changed_lines(UNCANONICAL, multi.text) == [
        "-             + len(items))  # multi-line", "+             - len(items))  # multi-line"]  # fmt: skip
    swapped = by_description["line 18: total - k * 2 -> operands swapped"]
    assert "return max(counts), (k * 2) - total, (total) // 2" in swapped.text  # own spelling


def test_edit_in_place_falls_back_to_the_canonical_module():
    assert edit_in_place("x = 1\n", "x = 2") == "x = 2\n"
    assert edit_in_place("x  =  1  # one\n", "x = 2") == "x  =  2  # one\n"
    assert edit_in_place("x = 1\n", "x = 1") == "x = 1\n"  # no change: nothing to find


def _commented_task(root):
    buggy = (
        '"""Clamp a value into [lo, hi]."""\n'
        "\n"
        "# Bounds are inclusive.\n"
        "\n"
        "\n"
        "def clamp(x, lo, hi):\n"
        "    if x < lo:  # below the range\n"
        "        return lo\n"
        "\n"
        "    if x < hi:  # above the range\n"
        "        return hi\n"
        "    return x\n"
    )
    test = "from clamp import clamp\n\n\ndef test_clamp():\n    assert clamp(1, 0, 3) == 1\n"
    return write_task_folder(
        root,
        task_id="commented-0001",
        instruction="fix clamp.py",
        metadata=TaskMetadata(family="clamp", bug_class="comparison_swap", split="test"),
        repo_files={"clamp.py": buggy, "tests/test_clamp.py": test,
                    "pyproject.toml": '[tool.pytest.ini_options]\npythonpath = ["."]\n'},
        hidden_test_files={"tests/test_clamp_hidden.py": test.replace("test_clamp(", "test_h(")
                           + "\n\ndef test_above():\n    assert clamp(5, 0, 3) == 3\n"},
        reference_patch=unified_diff("clamp.py", buggy, buggy.replace("x < hi:", "x > hi:")),
    )  # fmt: skip


def test_try_fix_keeps_comments_and_blank_lines_elsewhere(tmp_path):
    import shutil

    from components.scripted.reference import fixed_files
    from components.tasks.patching import apply_unified_diff

    task = _commented_task(tmp_path / "task")
    policy = OraclePolicy(style="fixes", fallback=False, recovery_rate=1.0)  # wrong, then right
    result = run_episode(task, policy, EnvConfig(tool_set="fix_search"), SandboxConfig())
    tries = [
        e["arguments"]["id"] for e in result.record["trajectory"] if e.get("action") == "try_fix"
    ]
    assert result.success and len(tries) == 2
    assert _changed_lines(*fixed_files(task)["clamp.py"]) == [
        "-    if x < hi:  # above the range", "+    if x > hi:  # above the range"]  # fmt: skip
    assert diff_changed_lines(result.final_diff) == 2  # what the patch metrics read
    shutil.copytree(task.repo_dir, tmp_path / "repo")
    apply_unified_diff(tmp_path / "repo", result.final_diff)
    fixed = (tmp_path / "repo" / "clamp.py").read_text()
    assert fixed == fixed_files(task)["clamp.py"][1]  # byte for byte the reference fix
    assert '"""\n\n# Bounds are inclusive.\n\n\ndef clamp' in fixed
