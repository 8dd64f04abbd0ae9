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
from typing import NoReturn

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


# A source tree mined for tasks (components/mining): links are part of real libraries
# (a README linked into a package, a package folder linked under src/), so they are not
# refused as such. The rule (issue 45, finding 1, for `agentrl tasks mine`):
#   - a symbolic link is kept when it, and every link it leads through, stays inside the
#     repository and ends at a regular file or a folder there: the copy holds its
#     target's content (a regular file, a folder), never a link;
#   - a link that leaves the repository (an absolute target, `..` past its root, a link
#     on the way that does), dangles, goes round in a circle, or leads to a folder that
#     holds it (a copy without end) is refused;
#   - a regular file with several names is kept only when every name is in the tree
#     (a hard link to a host file outside it is refused);
#   - a FIFO, a device or a socket, anywhere, is refused (directly or through a link);
#   - entries the copy leaves out (`ignore`, copytree's callable: .git, virtualenvs, ...)
#     are neither checked nor copied.
# One line naming the repository and the path inside it; no file content is read.
MAX_SOURCE_ENTRIES = 200_000  # links that repeat folders could make a copy without bound


def refuse_unsafe_source_tree(root: Path, name: str, *, ignore=None) -> None:
    """Raise UnsafeTaskFolder naming `name` and the first entry under `root` (sorted walk)
    that breaks the rule above; `root` is the repository's resolved path."""
    root = Path(os.path.realpath(root))
    names: dict[tuple[int, int], set[str]] = {}  # a multi-named file's names seen here
    walker = _SourceWalk(root, name, ignore, names)
    walker.folder(root, root, (root,))
    for (_dev, _ino), seen in sorted(names.items(), key=lambda kv: min(kv[1])):
        path = Path(min(seen))
        nlink = path.lstat().st_nlink
        if len(seen) < nlink:
            walker.refuse(path, f"a hard link ({nlink} names for one file, {len(seen)} of "
                          "them in the repository)")  # fmt: skip


class _SourceWalk:
    """The walk a link-following copy makes, checked entry by entry (see the rule)."""

    def __init__(self, root: Path, name: str, ignore, names: dict) -> None:
        self.root, self.name, self.ignore, self.names = root, name, ignore, names
        self.entries = 0

    def refuse(self, path: Path, problem: str) -> NoReturn:
        rel = path.relative_to(self.root).as_posix() if path != self.root else "its root"
        raise UnsafeTaskFolder(
            f"{self.name}: {rel} is {problem} (refused: links must stay inside the "
            "repository and end at a file or folder there, so that no host file becomes "
            "part of a mined task)"
        )

    def folder(self, shown: Path, real: Path, chain: tuple[Path, ...]) -> None:
        """Check the folder whose path in the copy is `shown` (its real path `real`;
        `chain`: the real folders above it, to find a link back up)."""
        try:
            entries = sorted(os.listdir(real))
        except OSError as e:
            self.refuse(shown, f"a folder that cannot be listed ({e.strerror})")
        skipped = set(self.ignore(str(real), entries)) if self.ignore else set()
        for entry in entries:
            if entry in skipped:
                continue
            self.entries += 1
            if self.entries > MAX_SOURCE_ENTRIES:
                self.refuse(shown, f"more than {MAX_SOURCE_ENTRIES} entries to copy "
                            "(links that repeat folders?)")  # fmt: skip
            self.entry(shown / entry, real / entry, chain)

    def entry(self, shown: Path, path: Path, chain: tuple[Path, ...]) -> None:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            path = self.link_target(shown, path)
            st = path.lstat()
        if stat.S_ISDIR(st.st_mode):
            if path in chain:
                self.refuse(shown, "a link to a folder that holds it (a copy without end)")
            self.folder(shown, path, (*chain, path))
            return
        problem = entry_problem(st)
        if problem is not None and not (stat.S_ISREG(st.st_mode) and st.st_nlink > 1):
            self.refuse(shown, problem)
        if st.st_nlink > 1:
            self.names.setdefault((st.st_dev, st.st_ino), set()).add(str(path))

    def link_target(self, shown: Path, link: Path) -> Path:
        """The real path a link inside the repository ends at, every hop checked."""
        for _ in range(40):  # the kernel's own bound on a chain of links
            text = os.readlink(link)
            hop = Path(os.path.normpath(os.path.join(os.path.realpath(link.parent), text)))
            if not hop.is_relative_to(self.root):
                self.refuse(shown, f"a symbolic link to {text} (outside the repository)")
            try:
                st = hop.lstat()
            except OSError:
                self.refuse(shown, f"a symbolic link to {text}, which does not exist")
            if not stat.S_ISLNK(st.st_mode):
                real = Path(os.path.realpath(hop))
                if not real.is_relative_to(self.root):  # through a linked folder on the way
                    self.refuse(shown, f"a symbolic link to {text} (outside the repository)")
                return real
            link = hop
        self.refuse(shown, "a symbolic link in a circle of links")
