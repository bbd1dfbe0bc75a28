"""Unpack the dataset archive into --data-dir once per machine, safely.

Every rank calls ensure_extracted(); a file lock lets the first one extract
while the others wait, and the ".extracted" marker, written last, lets every
later start skip the work. Entries are checked before anything is written:
no absolute paths, no "..", no links, no more data than the size limit.

Archives come as people make them: the junk that macOS and Windows add
(__MACOSX/, ._* files, .DS_Store, Thumbs.db) is checked like every entry but not
extracted, and dataset_root() reads an archive that wraps its data in one
top-level folder (mydata.zip holding mydata/train/...) as if that folder were
its root. The folder is unwrapped when reading, not moved at extraction, so the
same rule serves folders the user unpacked themselves and predict.py's inputs.
"""

import errno
import logging
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path, PurePath, PurePosixPath

from filelock import FileLock, Timeout
from tqdm import tqdm

from .errors import UserError
from .workspace import SAMPLE_ARCHIVE, SAMPLE_DATA_DIR

log = logging.getLogger(__name__)

DONE_MARKER = ".extracted"
STAGING = ".partial"
LOCK = ".lock"
QUIET_WAIT_S = 5.0  # a wait for another process's extraction shorter than this is not worth a line
# What file managers and archivers add beside the data: never extracted, never read as images.
JUNK_FOLDERS = {"__macosx"}
JUNK_FILES = {".ds_store", "thumbs.db", "desktop.ini"}


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
    if archive.is_dir():
        raise UserError(f"--dataset-zip {archive} is a folder, not an archive: pass it as --data-dir {archive}")
    if not archive.is_file():
        raise UserError(
            f"dataset archive {archive} not found: pass --dataset-zip PATH, or --data-dir with the unpacked data"
        )
    target.mkdir(parents=True, exist_ok=True)
    lock = FileLock(target / LOCK)
    _take_extraction_lock(lock, archive, target, lock_timeout)
    try:
        if already_extracted(archive, target):  # another process finished while we waited
            return False
        _extract_once(archive, target, max_bytes, show_progress)
        return True
    finally:
        lock.release()


def _take_extraction_lock(lock: FileLock, archive: Path, target: Path, timeout: float) -> None:
    """A longer wait for the lock is said: the rank that extracts may be one whose log is a file, and rank 0's
    console would otherwise stay silent for as long as a large archive takes."""
    rest = timeout
    if timeout > QUIET_WAIT_S:
        try:
            lock.acquire(timeout=QUIET_WAIT_S)
            return
        except Timeout:
            log.info("waiting for another process, which is extracting %s into %s", archive, target)
        rest = timeout - QUIET_WAIT_S
    try:
        lock.acquire(timeout=rest)
    except Timeout:
        raise UserError(
            f"waited {timeout:.0f} s for another process to extract {archive} into {target}: "
            f"if none is running, delete {target / LOCK} and start again"
        ) from None


def prepare_dataset(
    dataset_zip: str | None, data_dir: str, *, max_gb: float, lock_timeout: float, local_rank: int
) -> None:
    """run.py's data step, once per machine: extract the archive, if there is one, into `data_dir`. (The bundled
    sample is extracted when the data's code asks for its root: dataset_root(); never for data of the code's own.)"""
    if dataset_zip:
        ensure_extracted(
            dataset_zip,
            data_dir,
            max_bytes=max_gb * 1e9,
            lock_timeout=lock_timeout,
            show_progress=show_progress_here(local_rank),
        )


def extract_sample_for(data_dir: str | Path, lock_timeout: float = 3600.0) -> None:
    """The bundled sample's archive extracted where it belongs, when `data_dir` is its folder (dataset_root()
    asks; the data.py of the first versions asks itself)."""
    if SAMPLE_ARCHIVE.is_file() and Path(data_dir).resolve() == SAMPLE_DATA_DIR:
        ensure_extracted(SAMPLE_ARCHIVE, SAMPLE_DATA_DIR, lock_timeout=lock_timeout, show_progress=False)


def is_junk(path: str | PurePath) -> bool:
    """True for macOS and Windows leftovers: anything under __MACOSX/, ._* resource forks, .DS_Store, Thumbs.db."""
    parts = PurePosixPath(str(path).replace("\\", "/")).parts
    if any(part.lower() in JUNK_FOLDERS for part in parts):
        return True
    name = parts[-1] if parts else ""
    return name.startswith("._") or name.lower() in JUNK_FILES


def dataset_root(folder: str | Path, marker: str | Path | None = None) -> Path:
    """The folder to read the data from: `folder` itself, or the one top-level folder it wraps.

    `marker` is what the data's root holds (a path relative to it: "train", "train.csv",
    "images"): `folder` is used as it is when it holds it. If not, and it holds one folder
    (hidden files and junk aside) that does, that folder is the root: `mydata.zip` holding
    `mydata/train/...` (and a README beside it) reads as `train/...`. A lone `train/` is not
    unwrapped: `folder` holds the marker. Without a marker (predict.py's inputs), a folder
    that holds one folder and nothing else is unwrapped. The bundled sample's folder is extracted first.
    """
    extract_sample_for(folder)
    folder = Path(folder)
    if marker is not None and (folder / marker).exists():
        return folder
    if not folder.is_dir():
        return folder
    entries = [entry for entry in folder.iterdir() if not entry.name.startswith(".") and not is_junk(entry.name)]
    folders = [entry for entry in entries if entry.is_dir()]
    if marker is None:
        return folders[0] if len(entries) == 1 and folders else folder
    return folders[0] if len(folders) == 1 and (folders[0] / marker).exists() else folder


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
            # Written beside the data and moved in whole: a rank that looks without the lock (already_extracted)
            # must never read a marker opened but not yet written as another archive's.
            (staging / DONE_MARKER).write_text(archive_identity(archive), encoding="utf-8")
            (staging / DONE_MARKER).replace(target / DONE_MARKER)
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
    if path.is_absolute() or ".." in path.parts or ":" in "".join(path.parts[:1]):  # ("./" has no parts)
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
            if not info.is_dir() and not is_junk(info.filename):
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
                if not is_junk(entry.name):
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
