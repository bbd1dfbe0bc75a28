"""The dataset archive is extracted once per machine, safely, and bad archives stop with a clear message."""

import errno
import io
import logging
import multiprocessing
import shutil
import stat
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest
from conftest import ARCHIVE_JUNK
from filelock import FileLock

from {{ cookiecutter.project_slug }} import archive
from {{ cookiecutter.project_slug }}.errors import UserError

LAYOUT = {
    "train/cat/0.png": b"train cat 0",
    "train/cat/1.png": b"train cat 1",
    "train/dog/2.png": b"train dog 2",
    "val/cat/3.png": b"val cat 3",
    "val/dog/4.png": b"val dog 4",
}


def write_zip(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, content in entries.items():
            zf.writestr(name, content)
    return path


def write_tar(path: Path, entries: dict[str, bytes], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tf:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tf.addfile(info, io.BytesIO(content))
    return path


def files_under(root: Path) -> dict[str, bytes]:
    """Every regular file under root (hidden bookkeeping files left out), by relative POSIX path."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)
    }


def extract(source: Path, target: Path, **kwargs) -> bool:
    return archive.ensure_extracted(source, target, show_progress=False, **kwargs)


def assert_extracted_cleanly(target: Path) -> None:
    """target holds exactly LAYOUT, marked done, with no staging folder left behind."""
    assert files_under(target) == LAYOUT
    assert (target / archive.DONE_MARKER).is_file()
    assert not (target / archive.STAGING).exists()


def test_first_start_extracts_the_layout_and_writes_the_done_marker(tmp_path):
    source = write_zip(tmp_path / "data.zip", LAYOUT)
    target = tmp_path / "data"

    assert extract(source, target) is True

    assert_extracted_cleanly(target)


def test_second_start_does_not_extract_again(tmp_path):
    source = write_zip(tmp_path / "data.zip", LAYOUT)
    target = tmp_path / "data"
    extract(source, target)
    edited = target / "train/cat/0.png"
    edited.write_bytes(b"edited by the user")

    assert extract(source, target) is False

    assert edited.read_bytes() == b"edited by the user"
    assert files_under(target) == {**LAYOUT, "train/cat/0.png": b"edited by the user"}


def test_second_start_needs_no_archive_once_extracted(tmp_path):
    source = write_zip(tmp_path / "data.zip", LAYOUT)
    target = tmp_path / "data"
    extract(source, target)
    source.unlink()

    assert extract(source, target) is False
    assert files_under(target) == LAYOUT


def test_a_folder_filled_from_another_archive_is_not_silently_used_for_this_one(tmp_path):
    target = tmp_path / "data"
    extract(write_zip(tmp_path / "data.zip", LAYOUT), target)
    other = write_zip(tmp_path / "data.zip", {**LAYOUT, "train/bird/5.png": b"a new class"})

    with pytest.raises(UserError, match="another archive") as error:
        extract(other, target)

    assert str(target) in str(error.value) and "\n" not in str(error.value)
    assert files_under(target) == LAYOUT


def test_a_process_looking_while_the_marker_is_written_waits_rather_than_calling_it_another_archive(
    tmp_path, monkeypatch
):
    source = write_zip(tmp_path / "data.zip", LAYOUT)
    target = tmp_path / "data"
    seen = []
    write_text = Path.write_text

    def write_then_look(path, text, *args, **kwargs):
        # Another rank checks between the file's opening and its text, as one did on a loaded CI machine.
        path.open("w").close()
        seen.append(archive.already_extracted(source, target))
        return write_text(path, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_then_look)

    assert extract(source, target) is True

    assert seen == [False]
    assert_extracted_cleanly(target)


def test_interrupted_extraction_is_redone_cleanly(tmp_path):
    source = write_zip(tmp_path / "data.zip", LAYOUT)
    target = tmp_path / "data"
    # What a run killed mid-extraction leaves: a staging folder and a half-moved
    # top-level folder, but no done marker.
    (target / archive.STAGING / "val/cat").mkdir(parents=True)
    (target / archive.STAGING / "val/cat/3.png").write_bytes(b"va")
    (target / "train/cat").mkdir(parents=True)
    (target / "train/cat/0.png").write_bytes(b"tra")
    (target / "train/cat/stale.png").write_bytes(b"not in the archive")

    assert extract(source, target) is True

    assert_extracted_cleanly(target)


def test_data_that_was_not_extracted_by_the_project_is_never_overwritten(tmp_path):
    source = write_zip(tmp_path / "data.zip", LAYOUT)
    target = tmp_path / "data"
    (target / "train").mkdir(parents=True)
    (target / "train/mine.png").write_bytes(b"the user's own file")

    with pytest.raises(UserError, match="already exists"):
        extract(source, target)

    assert files_under(target) == {"train/mine.png": b"the user's own file"}
    assert not (target / archive.DONE_MARKER).exists()


def zip_with_entry(tmp_path: Path, name: str) -> Path:
    return write_zip(tmp_path / "evil.zip", {"train/cat/0.png": b"fine", name: b"escaped"})


def tar_with_entry(tmp_path: Path, name: str) -> Path:
    return write_tar(tmp_path / "evil.tar", {"train/cat/0.png": b"fine", name: b"escaped"})


def zip_with_symlink(tmp_path: Path, _name: str) -> Path:
    path = write_zip(tmp_path / "evil.zip", {"train/cat/0.png": b"fine"})
    link = zipfile.ZipInfo("train/cat/link.png")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr(link, "../../../outside/escaped.txt")
    return path


def tar_with_link(kind: bytes):
    def build(tmp_path: Path, _name: str) -> Path:
        path = write_tar(tmp_path / "evil.tar", {"train/cat/0.png": b"fine"})
        with tarfile.open(path, "a") as tf:
            link = tarfile.TarInfo("train/cat/link.png")
            link.type = kind
            link.linkname = str(tmp_path / "outside" / "escaped.txt")
            tf.addfile(link)
        return path

    return build


@pytest.mark.parametrize(
    ("build", "name", "says"),
    [
        (zip_with_entry, "../outside/escaped.txt", "outside"),
        (zip_with_entry, "train/../../outside/escaped.txt", "outside"),
        (zip_with_entry, "ABSOLUTE", "outside"),
        (tar_with_entry, "../outside/escaped.txt", "outside"),
        (tar_with_entry, "ABSOLUTE", "outside"),
        (zip_with_symlink, "train/cat/link.png", "link"),
        (tar_with_link(tarfile.SYMTYPE), "train/cat/link.png", "link"),
        (tar_with_link(tarfile.LNKTYPE), "train/cat/link.png", "link"),
    ],
    ids=[
        "zip-dotdot",
        "zip-nested-dotdot",
        "zip-absolute",
        "tar-dotdot",
        "tar-absolute",
        "zip-symlink",
        "tar-symlink",
        "tar-hardlink",
    ],
)
def test_entry_that_would_land_outside_the_data_folder_is_refused(tmp_path, build, name, says):
    if name == "ABSOLUTE":
        name = str(tmp_path / "outside" / "escaped.txt")
    source = build(tmp_path, name)
    target = tmp_path / "data"

    with pytest.raises(UserError, match=says) as error:
        extract(source, target)

    assert name in str(error.value)
    assert "\n" not in str(error.value)
    # Nothing was written: not outside the target, and not even the safe entry inside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([source.name, "data"])
    assert files_under(target) == {}
    assert not (target / archive.DONE_MARKER).exists()


def test_missing_archive_says_which_file_and_what_to_pass(tmp_path):
    missing = tmp_path / "nowhere.zip"

    with pytest.raises(UserError, match="not found") as error:
        extract(missing, tmp_path / "data")

    assert str(missing) in str(error.value)
    assert "--dataset-zip" in str(error.value)


def test_a_folder_given_as_the_archive_is_one_line_saying_to_pass_it_as_data_dir(tmp_path):
    (tmp_path / "unpacked").mkdir()

    with pytest.raises(UserError, match="is a folder, not an archive") as error:
        extract(tmp_path / "unpacked", tmp_path / "data")

    assert f"--data-dir {tmp_path / 'unpacked'}" in str(error.value) and not (tmp_path / "data").exists()


def test_file_that_is_not_an_archive_is_refused(tmp_path):
    source = tmp_path / "data.zip"
    source.write_text("this is an HTML error page, not a zip\n" * 20)
    target = tmp_path / "data"

    with pytest.raises(UserError, match="not a .zip") as error:
        extract(source, target)

    assert str(source) in str(error.value)
    assert files_under(target) == {}


def test_truncated_zip_is_refused_and_leaves_no_marker(tmp_path):
    whole = write_zip(tmp_path / "whole.zip", LAYOUT).read_bytes()
    source = tmp_path / "data.zip"
    source.write_bytes(whole[: len(whole) // 2])
    target = tmp_path / "data"

    with pytest.raises(UserError, match="truncated"):
        extract(source, target)

    assert files_under(target) == {}
    assert not (target / archive.DONE_MARKER).exists()


def test_zip_with_a_damaged_entry_is_refused_and_leaves_nothing_half_extracted(tmp_path):
    entries = {"train/cat/0.png": b"A" * 4096, "val/cat/1.png": b"B" * 4096}
    data = write_zip(tmp_path / "whole.zip", entries).read_bytes()
    source = tmp_path / "data.zip"
    source.write_bytes(data.replace(b"B" * 4096, b"C" * 4096))  # same sizes, wrong checksum
    target = tmp_path / "data"

    with pytest.raises(UserError, match="corrupt"):
        extract(source, target)

    assert files_under(target) == {}
    assert not (target / archive.STAGING).exists()
    assert not (target / archive.DONE_MARKER).exists()


def test_truncated_tar_gz_is_refused(tmp_path):
    entries = {f"train/cat/{i}.png": bytes(range(256)) * 64 for i in range(8)}
    whole = write_tar(tmp_path / "whole.tar.gz", entries, "w:gz").read_bytes()
    source = tmp_path / "data.tar.gz"
    source.write_bytes(whole[: len(whole) // 2])

    with pytest.raises(UserError, match="truncated"):
        extract(source, tmp_path / "data")

    assert not (tmp_path / "data" / archive.DONE_MARKER).exists()


def test_archive_declaring_more_than_the_size_limit_is_refused_before_writing(tmp_path):
    source = write_zip(tmp_path / "data.zip", {"train/cat/0.png": b"x" * 1000, "val/cat/1.png": b"y" * 1000})
    target = tmp_path / "data"

    with pytest.raises(UserError, match="limit"):
        extract(source, target, max_bytes=1500)

    assert files_under(target) == {}
    assert not (target / archive.STAGING).exists()
    assert extract(source, target, max_bytes=2000) is True


def test_tar_gz_archive_is_extracted_like_a_zip(tmp_path):
    source = write_tar(tmp_path / "data.tar.gz", LAYOUT, "w:gz")
    target = tmp_path / "data"

    assert extract(source, target) is True
    assert files_under(target) == LAYOUT
    assert extract(source, target) is False


def test_a_tar_made_inside_the_data_folder_with_dot_entries_is_extracted(tmp_path):
    unpacked = tmp_path / "unpacked"
    for name, content in LAYOUT.items():
        (unpacked / name).parent.mkdir(parents=True, exist_ok=True)
        (unpacked / name).write_bytes(content)
    source = tmp_path / "data.tar.gz"
    with tarfile.open(source, "w:gz") as tf:  # as `tar czf data.tar.gz -C unpacked .` makes it: ./, ./train/, ...
        tf.add(unpacked, arcname=".")
    target = tmp_path / "data"

    assert extract(source, target) is True
    assert_extracted_cleanly(target)


RACE_LAYOUT = {f"train/c{i % 4}/{i:04d}.png": bytes([i % 256]) * 512 for i in range(400)}


def race_worker(source: str, target: str, start, results) -> None:
    start.wait()
    try:
        results.put(("ok", extract(Path(source), Path(target))))
    except BaseException as error:  # report it to the test, whatever it is
        results.put(("error", repr(error)))


def test_two_processes_starting_together_extract_once(tmp_path):
    source = write_zip(tmp_path / "data.zip", RACE_LAYOUT)
    target = tmp_path / "data"
    context = multiprocessing.get_context("spawn")
    start, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=race_worker, args=(str(source), str(target), start, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)

    assert sorted(outcomes) == [("ok", False), ("ok", True)]
    assert files_under(target) == RACE_LAYOUT


def test_waiting_for_another_extraction_gives_up_with_one_line_after_the_timeout(tmp_path):
    source = write_zip(tmp_path / "data.zip", LAYOUT)
    target = tmp_path / "data"
    target.mkdir()

    with FileLock(target / archive.LOCK):  # another machine, extracting into the same shared folder
        with pytest.raises(UserError, match="waited 1 s for another process") as error:
            extract(source, target, lock_timeout=1)

    assert str(target / archive.LOCK) in str(error.value) and "\n" not in str(error.value)
    assert files_under(target) == {}


def test_a_wait_for_another_process_extracting_is_said_on_the_console_and_then_extracts(tmp_path, monkeypatch, caplog):
    source = write_zip(tmp_path / "data.zip", LAYOUT)
    target = tmp_path / "data"
    target.mkdir()
    monkeypatch.setattr(archive, "QUIET_WAIT_S", 0.2)
    other = FileLock(target / archive.LOCK, thread_local=False)  # released by the timer thread
    other.acquire()  # another rank of this machine, whose log is a file, took the lock first to extract
    releasing = threading.Timer(1.0, other.release)
    releasing.start()

    with caplog.at_level(logging.INFO, logger=archive.log.name):
        extracted = extract(source, target, lock_timeout=30)
    releasing.join()

    assert extracted
    assert files_under(target) == LAYOUT
    assert [record.getMessage() for record in caplog.records if "waiting" in record.getMessage()] == [
        f"waiting for another process, which is extracting {source} into {target}"
    ]


def test_an_extraction_without_a_wait_says_nothing_of_waiting(tmp_path, caplog):
    source = write_zip(tmp_path / "data.zip", LAYOUT)

    with caplog.at_level(logging.INFO, logger=archive.log.name):
        extract(source, tmp_path / "data")

    assert not [record for record in caplog.records if "waiting" in record.getMessage()]


def test_a_full_disk_during_extraction_says_so_and_leaves_no_partial_dataset(tmp_path, monkeypatch):
    source = write_zip(tmp_path / "data.zip", LAYOUT)
    target = tmp_path / "data"
    real_copy = shutil.copyfileobj
    copies = []

    def copy_until_the_disk_is_full(source_file, sink, *args):
        copies.append(1)
        if len(copies) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_copy(source_file, sink, *args)

    monkeypatch.setattr(archive.shutil, "copyfileobj", copy_until_the_disk_is_full)
    with pytest.raises(UserError, match="no space left on the device"):
        extract(source, target)

    assert files_under(target) == {}
    assert not (target / archive.STAGING).exists() and not (target / archive.DONE_MARKER).exists()
    monkeypatch.undo()
    assert extract(source, target) is True and files_under(target) == LAYOUT


def every_file_under(root: Path) -> set[str]:
    """Every file, hidden or not, but the project's own bookkeeping (marker, lock)."""
    bookkeeping = {archive.DONE_MARKER, archive.LOCK}
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and p.name not in bookkeeping}


@pytest.mark.parametrize("writer, name", [(write_zip, "data.zip"), (write_tar, "data.tar.gz")])
def test_junk_from_macos_and_windows_is_not_extracted(tmp_path, writer, name):
    source = writer(tmp_path / name, {**LAYOUT, **ARCHIVE_JUNK})
    target = tmp_path / "data"

    assert extract(source, target) is True

    assert every_file_under(target) == set(LAYOUT)
    assert not (target / "__MACOSX").exists()


@pytest.mark.parametrize(
    "path", ["__MACOSX/x/._a.png", "a/b/._c.PNG", "train/.DS_Store", "val/cat/Thumbs.db", "THUMBS.DB", "x\\__MACOSX\\y"]
)
def test_junk_is_recognised_wherever_it_is(path):
    assert archive.is_junk(path)


@pytest.mark.parametrize("path", ["train/cat/0.png", "train/_x.png", "macosx/0.png", "train/thumbs.png"])
def test_ordinary_files_are_not_junk(path):
    assert not archive.is_junk(path)


def test_junk_entries_are_checked_like_any_other(tmp_path):
    source = write_zip(tmp_path / "evil.zip", {**LAYOUT, "__MACOSX/../../outside/._x.png": b"escaped"})

    with pytest.raises(UserError, match="outside"):
        extract(source, tmp_path / "data")

    assert not (tmp_path / "outside").exists()


def test_an_archive_with_one_top_folder_reads_from_inside_it(tmp_path):
    wrapped = {f"mydata/{name}": content for name, content in LAYOUT.items()}
    source = write_zip(tmp_path / "mydata.zip", {**wrapped, **ARCHIVE_JUNK, "__MACOSX/mydata/._train": b"\x00"})
    target = tmp_path / "data"
    extract(source, target)

    root = archive.dataset_root(target, "train")

    assert root == target / "mydata"
    assert files_under(root) == LAYOUT


def test_a_lone_train_folder_at_the_root_is_not_unwrapped(tmp_path):
    source = write_zip(tmp_path / "data.zip", {k: v for k, v in LAYOUT.items() if k.startswith("train/")})
    target = tmp_path / "data"
    extract(source, target)

    assert archive.dataset_root(target, "train") == target
    assert archive.dataset_root(target) == target / "train"  # without a layout to look for, any lone folder is


def test_a_root_with_two_top_folders_or_without_the_layout_is_left_as_it_is(tmp_path):
    for folder in ("a/train", "b/train", "c/images"):
        (tmp_path / "two" / folder).mkdir(parents=True)
    (tmp_path / "other" / "c/images").mkdir(parents=True)

    assert archive.dataset_root(tmp_path / "two", "train") == tmp_path / "two"
    assert archive.dataset_root(tmp_path / "other", "train") == tmp_path / "other"
    assert archive.dataset_root(tmp_path / "missing", "train") == tmp_path / "missing"


def test_files_beside_the_top_folder_do_not_stop_it_being_unwrapped(tmp_path):
    (tmp_path / "data/mydata/train").mkdir(parents=True)
    (tmp_path / "data/README.txt").write_text("about this data")
    (tmp_path / "data/Thumbs.db").write_bytes(b"junk")

    assert archive.dataset_root(tmp_path / "data", "train") == tmp_path / "data/mydata"


def test_without_a_layout_only_a_folder_holding_nothing_but_one_folder_is_unwrapped(tmp_path):
    (tmp_path / "test/images").mkdir(parents=True)
    (tmp_path / "test/.DS_Store").write_bytes(b"junk")
    (tmp_path / "mixed/images").mkdir(parents=True)
    (tmp_path / "mixed/a.png").write_bytes(b"an image beside the folder")

    assert archive.dataset_root(tmp_path / "test") == tmp_path / "test/images"
    assert archive.dataset_root(tmp_path / "mixed") == tmp_path / "mixed"
