"""Unpack the dataset archive into --data-dir once per machine, safely.

Every rank calls ensure_extracted(); a file lock lets the first one extract
while the others wait, and the ".extracted" marker, written last, lets every
later start skip the work. Entries are checked before anything is written:
no absolute paths, no "..", no links, no more data than the size limit.
"""

import errno
import logging
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

from filelock import FileLock, Timeout
from tqdm import tqdm

from .errors import UserError

log = logging.getLogger(__name__)

DONE_MARKER = ".extracted"
STAGING = ".partial"
LOCK = ".lock"


def ensure_extracted(
    archive: str | Path,
    target: str | Path,
    *,
    max_bytes: float = 100e9,
    lock_timeout: float = 3600.0,
    show_progress: bool = True,
) -> bool:
    """Extract `archive` into `target` unless that was done before; True if it extracted."""
    archive, target = Path(archive), Path(target)
    if already_extracted(archive, target):
        return False
    if not archive.is_file():
        raise UserError(
            f"dataset archive {archive} not found: pass --dataset-zip PATH, or --data-dir with the unpacked data"
        )
    target.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(target / LOCK, timeout=lock_timeout):
            if already_extracted(archive, target):  # another process finished while we waited
                return False
            _extract_once(archive, target, max_bytes, show_progress)
            return True
    except Timeout:
        raise UserError(
            f"waited {lock_timeout:.0f} s for another process to extract {archive} into {target}: "
            f"if none is running, delete {target / LOCK} and start again"
        ) from None


def prepare_dataset(
    dataset_zip: str | None, data_dir: str, *, max_gb: float, lock_timeout: float, local_rank: int
) -> None:
    """run.py's data step: extract the archive, if there is one, into `data_dir`, once per machine."""
    if dataset_zip:
        ensure_extracted(
            dataset_zip,
            data_dir,
            max_bytes=max_gb * 1e9,
            lock_timeout=lock_timeout,
            show_progress=show_progress_here(local_rank),
        )


def archive_identity(archive: Path) -> str:
    return f"{archive.name} {archive.stat().st_size}\n"


def already_extracted(archive: Path, target: Path) -> bool:
    """True if `target` holds this archive's contents; an error if it holds another archive's."""
    marker = target / DONE_MARKER
    if not marker.exists():
        return False
    recorded = marker.read_text(encoding="utf-8")
    if archive.is_file() and recorded != archive_identity(archive):
        raise UserError(
            f"{target} holds data extracted from another archive ({recorded.split(' ')[0]}), not from {archive}: "
            "delete that folder to extract again, or pass another --data-dir"
        )
    return True


def _extract_once(archive: Path, target: Path, max_bytes: float, show_progress: bool) -> None:
    reader = _open(archive)
    with reader:
        members = reader.members()
        top_names = sorted({PurePosixPath(name).parts[0] for name, _ in members})
        staging = target / STAGING
        if staging.exists():  # an earlier extraction was interrupted: what it left is ours to redo
            shutil.rmtree(staging)
        else:
            clash = next((name for name in top_names if (target / name).exists()), None)
            if clash:
                raise UserError(
                    f"{target / clash} already exists and was not extracted by this project: "
                    "move it away, or point --data-dir at a new folder"
                )
        total = sum(size for _, size in members)
        if total > max_bytes:
            raise UserError(
                f"dataset archive {archive} declares {total / 1e9:.1f} GB uncompressed, over the "
                f"{max_bytes / 1e9:.1f} GB limit: raise --archive-max-gb if you trust it"
            )
        log.info("extracting %s into %s", archive, target)
        staging.mkdir()
        try:
            with tqdm(total=total, unit="B", unit_scale=True, desc="extract", disable=not show_progress) as bar:
                reader.extract_all(staging, bar.update)
            for name in top_names:
                _remove(target / name)  # left by an interrupted run, as checked above
                (staging / name).rename(target / name)
            (target / DONE_MARKER).write_text(archive_identity(archive), encoding="utf-8")
        except OSError as error:
            shutil.rmtree(staging, ignore_errors=True)
            if error.errno == errno.ENOSPC:
                raise UserError(
                    f"no space left on the device while extracting {archive} into {target}: free some space"
                ) from None
            raise
        except (zipfile.BadZipFile, tarfile.TarError, EOFError) as error:
            shutil.rmtree(staging, ignore_errors=True)
            raise UserError(f"dataset archive {archive} is corrupt or truncated ({error}): download it again") from None
        staging.rmdir()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _check_entry(archive: Path, name: str, is_link: bool) -> None:
    path = PurePosixPath(name.replace("\\", "/"))
    if is_link:
        raise UserError(
            f"dataset archive {archive} holds a link entry {name!r}; links are refused, repack it without them"
        )
    if path.is_absolute() or ".." in path.parts or ":" in path.parts[0]:
        raise UserError(
            f"dataset archive {archive} holds an entry {name!r} that would land outside --data-dir; refused"
        )


def _open(archive: Path):
    if zipfile.is_zipfile(archive):
        return _ZipReader(archive)
    if tarfile.is_tarfile(archive):
        return _TarReader(archive)
    raise UserError(f"{archive} is not a .zip, .tar or .tar.gz archive (or it is truncated): download it again")


class _ZipReader:
    def __init__(self, archive: Path):
        try:
            self.zip = zipfile.ZipFile(archive)
        except (zipfile.BadZipFile, OSError) as error:
            raise UserError(f"dataset archive {archive} is corrupt or truncated ({error}): download it again") from None
        self.files = []
        for info in self.zip.infolist():
            is_link = (info.external_attr >> 16) & 0o170000 == 0o120000
            _check_entry(archive, info.filename, is_link)
            if not info.is_dir():
                self.files.append(info)

    def members(self) -> list[tuple[str, int]]:
        return [(info.filename, info.file_size) for info in self.files]

    def extract_all(self, destination: Path, progress) -> None:
        for info in self.files:
            path = destination / info.filename
            path.parent.mkdir(parents=True, exist_ok=True)
            with self.zip.open(info) as source, open(path, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
            progress(info.file_size)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.zip.close()


class _TarReader:
    def __init__(self, archive: Path):
        try:
            self.tar = tarfile.open(archive)
            entries = self.tar.getmembers()
        except (tarfile.TarError, EOFError, OSError) as error:
            raise UserError(f"dataset archive {archive} is corrupt or truncated ({error}): download it again") from None
        self.files = []
        for entry in entries:
            _check_entry(archive, entry.name, entry.issym() or entry.islnk())
            if entry.isfile():
                self.files.append(entry)
            elif not entry.isdir():
                raise UserError(f"dataset archive {archive} holds a special file {entry.name!r}; refused")

    def members(self) -> list[tuple[str, int]]:
        return [(entry.name, entry.size) for entry in self.files]

    def extract_all(self, destination: Path, progress) -> None:
        for entry in self.files:
            # The "data" filter re-checks every path and drops unsafe modes.
            self.tar.extract(entry, destination, filter="data")
            progress(entry.size)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.tar.close()


def show_progress_here(local_rank: int) -> bool:
    """One progress bar per machine, and only on a terminal (not in job logs)."""
    return local_rank == 0 and sys.stderr.isatty()
