"""What the versioning tests compare: a folder's files and their bytes."""

from pathlib import Path


def file_tree(data: Path) -> dict[str, bytes]:
    """{relative posix path: bytes} of every file under `data`."""
    return {
        p.relative_to(data).as_posix(): p.read_bytes()
        for p in sorted(data.rglob("*"))
        if p.is_file()
    }
