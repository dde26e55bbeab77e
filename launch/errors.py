"""Mistakes a user can fix: one line on stderr and exit status 2, never a traceback.

Commands raise ``UserError`` (or a subclass) with the cause and the fix; ``kernelrl.launch.cli``
prints it as ``kernelrl <command>: message``. The checks here run before anything is written, so
a rejected run leaves every file as it was.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["UserError", "check_folder_path", "check_parent_folder"]


class UserError(ValueError):
    """A value the user gave that cannot work; the message names it and what to do instead."""


def _first_file(path: Path) -> Path | None:
    """``path`` or its nearest existing ancestor, if that is something other than a folder."""
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return None if candidate.is_dir() else candidate
    return None


def check_folder_path(path: str | Path, key: str) -> None:
    """Raise ``UserError`` unless ``path`` is a folder or could be created as one."""
    blocker = _first_file(Path(path))
    if blocker is None:
        return
    where = "is a file" if blocker == Path(path) else f"lies under {blocker}, which is a file"
    raise UserError(f"{key} {path} {where}, not a folder; choose another {key}")


def check_parent_folder(path: str | Path, key: str) -> None:
    """Raise ``UserError`` unless the folder that would hold the file ``path`` can exist."""
    parent = Path(path).parent
    blocker = _first_file(parent)
    if blocker is not None:
        where = "is a file" if blocker == parent else f"lies under {blocker}, which is a file"
        raise UserError(f"{key} {path}: its folder {parent} {where}; choose another {key}")
