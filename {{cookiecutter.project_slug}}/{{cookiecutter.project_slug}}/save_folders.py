"""The folders of sharded saves, and the links that name them: DIR/checkpoints/last and best.

Every rank writes its part of a save into a new folder, save-<time>; once the folder is complete, rank 0 points
the links at it. A folder cannot be renamed over another, but a link can be replaced in one step, so a crash
during a save leaves the links on the previous complete save. Both frameworks' checkpoint.py use these.
"""

import os
import shutil
import time
from pathlib import Path

LINKS = ("last", "best")


def new_name() -> str:
    return f"save-{time.time_ns()}"


def publish(directory: Path, folder: Path, is_best: bool) -> None:
    """Make the complete save `folder` the last one (and the best): the links switched to it, older saves gone."""
    if is_best:  # first: a crash between the two leaves last on the best's predecessor, not best behind
        point(directory / "best", folder)
    point(directory / "last", folder)
    remove_unlinked(directory)


def point(link: Path, folder: Path) -> None:
    """Point `link` at `folder` in one step: a new link, os.replace()d over the old one. A real folder in its
    place (a copy that followed the link: cp -L, rsync -L) becomes a save like the others."""
    if link.is_dir() and not link.is_symlink():
        link.rename(link.with_name(new_name()))
    temporary = link.with_name(f".{link.name}.tmp")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(folder.name)
    os.replace(temporary, link)


def remove_unlinked(directory: Path) -> None:
    """Saves neither link points at: older ones, and any a crash left incomplete."""
    kept = {(directory / link).resolve() for link in LINKS}
    for folder in directory.glob("save-*"):
        if folder.resolve() not in kept:
            shutil.rmtree(folder, ignore_errors=True)


def newest(file: Path, link: Path, last_written: str) -> Path | None:
    """The newer complete save of the two forms: the single `file`, or the folder `link` names (complete once
    its `last_written` file is there); None where there is neither."""
    saves = [path for path in (file, link / last_written) if path.is_file()]
    if not saves:
        return None
    path = max(saves, key=lambda save: save.stat().st_mtime)
    return link if path.parent == link else path
