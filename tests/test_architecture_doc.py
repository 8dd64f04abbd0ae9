"""docs/ARCHITECTURE.md's layout table names every module, so a newcomer finds each one.

A module `components/<folder>/<name>.py` is named in its folder's row as `<name>.py`; a
top-level `components/<name>.py` by its path; a flow `flows/<name>.py` in the flows row.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rows() -> dict[str, str]:
    """First cell of each layout-table row -> the whole row."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = text.split("| folder | what lives there", 1)[1].split("\n\n", 1)[0]
    return {
        line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| `")
    }


def test_every_module_is_in_the_layout_table():
    rows = _rows()
    table = "\n".join(rows.values())
    missing = []
    for path in sorted([*(ROOT / "components").rglob("*.py"), *(ROOT / "flows").glob("*.py")]):
        rel = path.relative_to(ROOT)
        if path.name == "__init__.py":
            continue
        if len(rel.parts) == 2 and rel.parts[0] == "components":
            named = f"`{rel.as_posix()}`" in table
        else:
            row = rows.get(f"`{rel.parent.as_posix()}/`", "")
            named = f"`{path.name}`" in row
        if not named:
            missing.append(rel.as_posix())
    assert not missing, f"docs/ARCHITECTURE.md's layout table does not name {missing}"
