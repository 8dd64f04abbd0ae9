"""What a task folder may hold before anything in it is read: folders and regular files.

Every reader of a task folder, whatever its format (our task.json folders, Harbor tasks, a
QuixBugs checkout, mined task folders), calls `refuse_unsafe_entries` first (issue 45,
finding 1). The host reads these files (a prompt, a Dockerfile's build context, hidden
tests, a solution) and copies them into tasks and sandboxes, so any entry that is not a
folder or a regular file of the folder's own would make a host file part of a task:
  - a symbolic link (`ln -s /etc/shadow instruction.md`: the host's file becomes the prompt);
  - a hard link (a second name of a file outside the folder, such as one the user cannot
    read through the folder but the importer can, or one whose content changes later);
  - a FIFO (a read that blocks for ever, or is fed by another process), a character or
    block device (/dev/zero as a test file, a disk), a socket.
The walk never follows a link and reads no file content, only each entry's own metadata
(lstat). The refusal is one line naming the task and the path inside it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# The kinds of entry refused, by their lstat file type (regular files with links apart).
_SPECIAL_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnsafeTaskFolder(ValueError):
    """A task folder holds a link or special file; the message names the task and path."""


def entry_problem(st: os.stat_result) -> str | None:
    """What is wrong with an entry whose lstat is `st` (None: a folder or a regular file
    with no other name)."""
    mode = st.st_mode
    for is_kind, kind in _SPECIAL_KINDS:
        if is_kind(mode):
            return kind
    if stat.S_ISREG(mode):
        if st.st_nlink > 1:
            return f"a hard link ({st.st_nlink} names for one file)"
        return None
    if stat.S_ISDIR(mode):
        return None
    return "a special file"


def refuse_unsafe_entries(root: Path, task: str, *, named_from: Path | None = None) -> None:
    """Raise UnsafeTaskFolder naming `task` and the first entry under `root` (sorted walk,
    `root` itself included) that is not a folder or a regular file of its own; reads no
    content and follows no link. Paths are named from `named_from` (default: `root`)."""
    base = named_from or root

    def refuse(path: Path, problem: str) -> None:
        rel = path.relative_to(base).as_posix() if path != base else "the task folder itself"
        raise UnsafeTaskFolder(
            f"{task}: {rel} is {problem} (refused: a task folder holds folders and regular "
            "files only, so that no host file becomes part of the task)"
        )

    try:
        st = root.lstat()
    except FileNotFoundError as e:
        raise UnsafeTaskFolder(f"{task}: {root} does not exist") from e
    problem = entry_problem(st)
    if problem is not None:
        refuse(root, problem)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeTaskFolder(f"{task}: {root} is not a folder")
    for folder, dirs, files in os.walk(root, followlinks=False, onerror=_raise):
        dirs.sort()
        for name in [*dirs, *sorted(files)]:
            path = Path(folder) / name
            problem = entry_problem(path.lstat())
            if problem is not None:
                refuse(path, problem)


def _raise(error: OSError) -> None:
    """os.walk's onerror: a folder that cannot be listed is not skipped in silence."""
    raise UnsafeTaskFolder(f"{error.filename}: cannot be listed ({error.strerror})")
