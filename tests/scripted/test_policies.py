from components.scripted.reference import minimal_edits


def _apply(text, edits):
    for e in edits:
        assert text.count(e.old) == 1, e
        text = text.replace(e.old, e.new, 1)
    return text


def test_minimal_edit_is_one_line_when_unique():
    before = "def f(x):\n    if x < 3:\n        return 1\n    return 0\n"
    after = before.replace("x < 3", "x <= 3")
    (edit,) = minimal_edits("m.py", before, after)
    assert edit.old == "    if x < 3:\n" and edit.new == "    if x <= 3:\n"
    assert _apply(before, [edit]) == after


def test_minimal_edit_grows_context_until_unique():
    before = (
        "def f(a):\n    a = a + 1\n    return a\n\ndef g(a):\n    a = a + 1\n    return a * 2\n"
    )
    after = before.replace("    a = a + 1\n    return a * 2", "    a = a - 1\n    return a * 2")
    edits = minimal_edits("m.py", before, after)
    assert len(edits) == 1 and before.count(edits[0].old) == 1
    assert _apply(before, edits) == after


def test_insertion_and_deletion():
    before = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n"
    after = before.replace("    return total\n", "")
    assert _apply(before, minimal_edits("m.py", before, after)) == after
    assert _apply(after, minimal_edits("m.py", after, before)) == before
