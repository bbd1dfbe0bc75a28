"""The CSV a competition takes (submission.py), whatever the task: a sample submission's header, IDs and row order
followed, its extra columns filled or refused in one line, masks run-length encoded."""

import argparse
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.submission import (
    check_apart,
    image_ids,
    input_path,
    leave_input,
    read_besides,
    rle_encode,
    write_csv,
)  # fmt: skip

IMAGES = ["a/cat.png", "b/dog.jpg", "b/fox.png"]


def write_sample(path: Path, lines: list[str]) -> str:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return str(path)


def one_line_refusal(tmp_path: Path, sample: list[str], **given) -> str:
    output = tmp_path / "submission.csv"
    with pytest.raises(UserError) as raised:
        write_csv(str(output), ["image", "label"], IMAGES, ["cat", "dog", "fox"],
                  sample=write_sample(tmp_path / "sample.csv", sample), **given)  # fmt: skip
    assert "\n" not in str(raised.value) and not output.exists()
    return str(raised.value)


def test_a_sample_with_a_probability_column_gets_the_probability_and_its_own_header(tmp_path):
    sample = write_sample(tmp_path / "sample.csv", ["Id,Category,Confidence", "fox,?,0", "cat,?,0"])

    ids, output = [image_ids(name) for name in IMAGES], tmp_path / "s.csv"
    write_csv(str(output), ["image", "label"], IMAGES, ["cat", "dog", "fox"], [0.9, 0.8, 0.51234], sample, ids)

    assert output.read_text(encoding="utf-8") == "Id,Category,Confidence\nfox,fox,0.5123\ncat,cat,0.9000\n"


def test_a_sample_column_nothing_fills_ends_in_one_line_naming_it_and_writes_nothing(tmp_path):
    message = one_line_refusal(tmp_path, ["Id,Category,Confidence,Notes", "cat,?,0,"], probabilities=[0.9, 0.8, 0.7])

    assert "nothing fills Notes" in message and "writes 3 (image, label, probability)" in message
    assert "nothing fills Confidence, Notes" in one_line_refusal(tmp_path, ["Id,Category,Confidence,Notes"])


def test_a_sample_submission_that_is_a_folder_or_missing_is_one_line_saying_which(tmp_path):
    for given, said in ((tmp_path, "is a folder: name the CSV file"), (tmp_path / "none.csv", "not found")):
        with pytest.raises(UserError, match=said):
            write_csv(str(tmp_path / "out.csv"), ["image", "label"], IMAGES, ["cat", "dog", "fox"], sample=str(given))
    assert not (tmp_path / "out.csv").exists()


def test_a_sample_names_an_image_by_its_path_its_file_name_or_its_name_without_the_extension(tmp_path):
    sample = write_sample(tmp_path / "sample.csv", ["image_id,label", "fox,", "dog.jpg,", "a/cat.png,"])

    ids = [image_ids(name) for name in IMAGES]
    write_csv(str(tmp_path / "s.csv"), ["image", "label"], IMAGES, ["cat", "dog", "fox"], sample=sample, ids=ids)

    assert (tmp_path / "s.csv").read_text(encoding="utf-8") == "image_id,label\nfox,fox\ndog.jpg,dog\na/cat.png,cat\n"


def test_an_id_two_inputs_share_is_refused_only_where_the_sample_names_it(tmp_path):
    names = ["a/x.png", "b/x.png"]
    ids = [image_ids(name) for name in names]
    sample = write_sample(tmp_path / "paths.csv", ["id,label", "b/x.png,", "a/x.png,"])

    write_csv(str(tmp_path / "s.csv"), ["image", "label"], names, ["1", "2"], sample=sample, ids=ids)

    assert (tmp_path / "s.csv").read_text(encoding="utf-8") == "id,label\nb/x.png,2\na/x.png,1\n"
    with pytest.raises(UserError, match="inputs a/x.png and b/x.png have the same ID 'x'"):
        write_csv(str(tmp_path / "t.csv"), ["image", "label"], names, ["1", "2"],
                  sample=write_sample(tmp_path / "stems.csv", ["id,label", "x,"]), ids=ids)  # fmt: skip
    rows_named_by_their_ids = ["7", "1", "8", "1"]
    with pytest.raises(UserError, match="inputs number 2 and number 4 have the same ID '1'"):
        write_csv(str(tmp_path / "u.csv"), ["id", "label"], rows_named_by_their_ids, ["1", "2", "3", "4"],
                  sample=write_sample(tmp_path / "ids.csv", ["id,label", "1,"]))  # fmt: skip


def test_an_output_that_is_a_folder_is_refused_in_one_line(tmp_path):
    (tmp_path / "p.csv").mkdir()

    with pytest.raises(UserError, match="--output .*p.csv is a folder"):
        write_csv(str(tmp_path / "p.csv"), ["id", "label"], ["1"], ["a"])


@pytest.mark.parametrize(
    "given, output, refused",
    [
        ("test", "test", True),  # masks over the images
        ("test", "test/masks", True),
        ("test", "test/predictions.csv", True),
        ("test/x.png", "test", True),  # the mask of x.png would be test/x.png
        ("test.csv", "test.csv", True),
        ("test", "masks", False),
        ("test/x.png", "test/masks", False),
        ("test.csv", "predictions.csv", False),
    ],
)
def test_an_output_that_would_replace_the_inputs_is_refused_before_anything_is_written(
    tmp_path, given, output, refused
):
    (tmp_path / "test").mkdir()
    for name in ("test/x.png", "test.csv", "test.zip"):
        (tmp_path / name).write_bytes(b"an input")

    if not refused:
        check_apart(str(tmp_path / given), str(tmp_path / output))
        return
    with pytest.raises(UserError, match="is where --input .* is read from") as error:
        check_apart(str(tmp_path / given), str(tmp_path / output))
    assert "\n" not in str(error.value)


def test_an_output_that_a_checkpoint_or_another_option_names_is_refused_naming_that_option(tmp_path):
    checkpoint, sample = tmp_path / "best.pt", tmp_path / "sample.csv"
    for path in (checkpoint, sample):
        path.write_bytes(b"read by predict.py")
    args = argparse.Namespace(input=str(tmp_path / "test"), output=None, sample_submission=str(sample), batch_size=8)
    read = read_besides(args, [checkpoint])

    for output, option in ((checkpoint, "--checkpoint"), (sample, "--sample-submission")):
        with pytest.raises(UserError, match=f"--output {output} is what {option} names") as error:
            check_apart(args.input, str(output), read)
        assert "\n" not in str(error.value)
    check_apart(args.input, str(tmp_path / "submission.csv"), read)


def test_an_output_folder_that_holds_files_already_is_refused_before_predicting_and_an_empty_one_is_not(tmp_path):
    (tmp_path / "earlier" / "a").mkdir(parents=True)
    (tmp_path / "earlier" / "a" / "x.png").write_bytes(b"an earlier prediction's mask")
    (tmp_path / "empty").mkdir()

    with pytest.raises(UserError, match="is a folder that is not empty: name a new file or folder"):
        check_apart(str(tmp_path / "test"), str(tmp_path / "earlier"))
    check_apart(str(tmp_path / "test"), str(tmp_path / "empty"))
    assert (tmp_path / "earlier" / "a" / "x.png").read_bytes() == b"an earlier prediction's mask"


def test_run_length_pairs_number_pixels_from_1_down_each_column_unless_row_order_is_asked():
    mask = np.array([[1, 0, 1], [1, 0, 1]])

    assert rle_encode(mask) == "1 2 5 2"
    assert rle_encode(mask, "row") == "1 1 3 2 6 1"
    assert rle_encode(np.zeros((2, 3))) == "" and rle_encode(np.ones((2, 3)), "row") == "1 6"


def test_an_extracted_input_stays_until_the_last_process_of_the_machine_leaves_it_even_after_an_error(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # where predict.py extracts the archive
    monkeypatch.setattr(tempfile, "tempdir", None)  # (gettempdir() reads TMPDIR again)
    (tmp_path / "tmp").mkdir()
    with zipfile.ZipFile(tmp_path / "test.zip", "w") as archive:
        archive.writestr("test/a.png", b"an image")
    (source, extracted), (again, _) = [input_path(str(tmp_path / "test.zip"), 1.0, rank, rank) for rank in (0, 1)]

    leave_input(extracted, 0)  # rank 0 ended first (an error of its own): rank 1 may still be reading
    assert again == source and (source / "a.png").read_bytes() == b"an image"
    leave_input(extracted, 1)
    assert not list((tmp_path / "tmp").iterdir())


def test_a_process_that_leaves_as_another_removes_the_extraction_ends_without_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (gettempdir() reads TMPDIR again)
    (tmp_path / "tmp").mkdir()
    with zipfile.ZipFile(tmp_path / "test.zip", "w") as archive:
        archive.writestr("test/a.png", b"an image")
    _, extracted = input_path(str(tmp_path / "test.zip"), 1.0, 0, 0)
    leave_input(extracted, 0)  # the other process, leaving at the same moment, saw no one left and removed it all

    leave_input(extracted, 1)

    assert not list((tmp_path / "tmp").iterdir())


def test_a_relative_input_not_found_names_the_folder_it_was_looked_for_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    with pytest.raises(UserError, match=f"--input ../test.csv not found in {tmp_path}: pass the file"):
        input_path("../test.csv", 1.0, 0, 0)


def test_an_archive_that_cannot_be_extracted_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # (gettempdir() reads TMPDIR again)
    (tmp_path / "tmp").mkdir()
    with zipfile.ZipFile(tmp_path / "whole.zip", "w") as whole:
        whole.writestr("test/a.png", b"an image" * 1000)
    (tmp_path / "test.zip").write_bytes((tmp_path / "whole.zip").read_bytes()[:-40])  # a download cut short

    with pytest.raises(UserError, match="archive"):
        input_path(str(tmp_path / "test.zip"), 1.0, 0, 0)

    assert not list((tmp_path / "tmp").iterdir())
