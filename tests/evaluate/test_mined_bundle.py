"""The safety suite's bundled mined task is what today's mining makes (issue 44, item 4): its
hidden tests are not the workspace's, part of them held out, so the mined-task attacks play
against a task whose visible test values are not all its hidden checks. (The slow tier,
tests/evaluate/test_safety_suite.py, mines the fixture afresh and compares every file.)"""

from __future__ import annotations

import json
import re

from components.evaluate.safety.tasks import MINED_BUNDLE, MINED_CONFIG


def test_the_bundled_mined_task_holds_hidden_tests_out_of_the_workspace():
    bundle = json.loads(MINED_BUNDLE.read_text())
    assert bundle["config"] == MINED_CONFIG
    files = bundle["files"]
    spec = json.loads(files["task.json"])
    held = spec["metadata"]["hidden_tests_held_out"]
    assert held, "mining held no hidden test out of the workspace"
    for rel, names in held.items():
        hidden, visible = files[f"hidden_tests/{rel}"], files[f"repo/{rel}"]
        assert hidden != visible
        for name in names:
            function = name.split("::")[-1]
            assert re.search(rf"^def {function}\(", hidden, re.M)
            assert not re.search(rf"^def {function}\(", visible, re.M)
    # the failing tests the instruction names are still there for the agent to run
    for failing in spec["metadata"]["failing_tests"]:
        rel, function = failing.split("::")[0], failing.split("::")[-1].split("[")[0]
        assert re.search(rf"^def {function}\(", files[f"repo/{rel}"], re.M)
