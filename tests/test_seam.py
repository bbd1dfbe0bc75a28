"""Slow tier: the seam keeps its word, 2 processes: a mistake is one error line on the console under every launcher
of both frameworks, the user's own frames above it; per-sample values of every shape (the README's tagging
example) are exact on 1, 2 and 3 processes; a batch of any structure is counted right."""

import csv
import io
import json
import re
import zipfile
from pathlib import Path

import pytest
from conftest import LAUNCH_CASES, run
from test_training import TRAIN_SIZE, VAL_SIZE, read_metrics, train

pytestmark = pytest.mark.slow

BASIC_FRAMEWORKS = [{"framework": "pytorch"}, {"framework": "paddle"}]
TEXT_VAL_SIZE = 205  # the sample docstrings' val.csv


def console_of(result) -> list[str]:
    """The lines a user sees (paddle's launcher shows worker 0's output on stdout)."""
    return (result.stdout + result.stderr).splitlines()


def error_lines(result) -> list[str]:
    return [line for line in console_of(result) if line.startswith("error: ")]


def user_frames(result) -> list[str]:
    return [line.strip() for line in console_of(result) if line.strip().startswith('File "')]


def append(project: Path, module: str, code: str) -> None:
    with open(project / "dist_train" / module, "a", encoding="utf-8") as file:
        file.write(code)


MISREAD_VALIDATION = """

_validation_step = validation_step


def validation_step(model, batch):  # noqa: F811 - a test's mistake: a part the batches do not have
    return _validation_step(model, batch["pixels"])
"""


@pytest.mark.parametrize("answers", LAUNCH_CASES, ids=lambda a: "-".join(a.values()))
def test_bad_data_and_a_seam_mistake_are_each_one_error_line_under_every_launcher(bake, tmp_path, answers):
    project = bake(**answers)

    missing = run(["bash", "run.sh", "--data-dir", str(tmp_path / "missing"), "--output-dir", str(tmp_path / "a")],
                  project, timeout=120, NPROC_PER_NODE="2")  # fmt: skip
    append(project, "task.py", MISREAD_VALIDATION)
    misread = run(["bash", "run.sh", "--output-dir", str(tmp_path / "b")], project, timeout=120, NPROC_PER_NODE="2")

    assert missing.returncode == 1 and misread.returncode == 1
    assert error_lines(missing) == [f"error: data folder {tmp_path / 'missing' / 'train'} not found: " + (
        "--data-dir needs train/<class>/ (and val/<class>/) inside, or one folder holding them; for images labelled "
        "by a CSV file pass --labels-csv")]  # fmt: skip
    [line] = error_lines(misread)
    assert line.startswith("error: task.validation_step() failed on a batch of ") and "TypeError" in line, line
    [frame] = user_frames(misread)  # the user's own frame, once: not the engine's, not a rank's second copy
    assert frame.startswith(f'File "{project / "dist_train" / "task.py"}", line ') and frame.endswith("validation_step")
    assert not any(
        "Traceback" in line or "Container failed" in line for line in console_of(misread) + console_of(missing)
    )


# The training set's collate reads a key its samples do not have: met at the first training batch, in the loader's
# worker processes (--workers 2), or in the training process (PyTorch) or paddle's loader thread (--workers 0).
BROKEN_TRAINING_COLLATE = """

class _Texts(TextDataset):
    @staticmethod
    def collate(samples):
        return {"labels": [sample["label"] for sample in samples]}


_build_datasets = build_datasets


def build_datasets(args):  # noqa: F811
    train, val, num_classes = _build_datasets(args)
    return _Texts(train.token_ids, train.labels, train.description), val, num_classes
"""
SET_COLLATE = """

TextDataset.collate = staticmethod(lambda samples: {len(samples)})  # a test's mistake: a set is no batch
"""


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("answers", BASIC_FRAMEWORKS, ids=lambda a: a["framework"])
def test_a_key_error_in_collate_shows_the_users_frames_and_names_collate(bake, tmp_path, answers, workers):
    project = bake(task="text", **answers)
    append(project, "data.py", BROKEN_TRAINING_COLLATE)

    result = run(["bash", "run.sh", "--workers", workers, "--output-dir", str(tmp_path / "out")], project,
                 timeout=120, NPROC_PER_NODE="2")  # fmt: skip

    assert result.returncode == 1
    assert error_lines(result) == ["error: _Texts.collate() in data.py raised KeyError: 'label'"]
    frames = user_frames(result)
    assert frames and all(frame.startswith(f'File "{project / "dist_train" / "data.py"}", line ') for frame in frames)
    assert frames[0].endswith("in collate") and "Traceback" not in result.stdout + result.stderr


PER_SAMPLE_LOSS = """

def training_loss(model, batch):  # noqa: F811 - a test's mistake: each text's loss, not their mean
    return F.cross_entropy(logits_of(model, batch), batch["labels"], reduction="none")
"""
# A collate whose batch the loops cannot read is named, not the task; a mistake each rank meets on a batch of its
# own sizes (each text batch is padded to its longest: Tensor[32, N]) is still one line.
TEXT_MISTAKES = {
    "set-collate": ("data.py", SET_COLLATE, "error: <lambda>() in data.py made a batch of set: the loops cannot read "),
    "per-sample-loss": ("task.py", PER_SAMPLE_LOSS, "error: task.training_loss() returned Tensor[32] for a batch of "),
}


@pytest.mark.parametrize("mistake", TEXT_MISTAKES)
@pytest.mark.parametrize("answers", BASIC_FRAMEWORKS, ids=lambda a: a["framework"])
def test_a_mistake_in_the_text_tasks_files_is_one_line_on_three_ranks_naming_what_went_wrong(
    bake, tmp_path, answers, mistake
):
    file, code, said = TEXT_MISTAKES[mistake]
    project = bake(task="text", **answers)
    append(project, file, code)

    result = run(["bash", "run.sh", "--output-dir", str(tmp_path / "out")], project, timeout=120, NPROC_PER_NODE="3")

    assert result.returncode == 1
    [line] = error_lines(result)
    assert line.startswith(said), line


def readme_example(project: Path, title: str) -> list[str]:
    """The Python blocks of a section of the baked README, in order."""
    readme = (project / "README.md").read_text(encoding="utf-8")
    section = readme.split(f"### {title}\n", 1)[1].split("\n##", 1)[0]  # to the next heading (not a comment)
    return re.findall(r"```python\n(.*?)```", section, re.DOTALL)


def tagged_texts(sample: Path, folder: Path) -> Path:
    """The sample's texts with a tag per word (as data.py's tokens() splits them): NUM, SHORT, WORD or LONG."""

    def tag(word: str) -> str:
        return "NUM" if word.isdigit() else "SHORT" if len(word) <= 3 else "LONG" if len(word) >= 8 else "WORD"

    folder.mkdir()
    with zipfile.ZipFile(sample) as archive:
        for name in ("train.csv", "val.csv"):
            rows = csv.DictReader(io.StringIO(archive.read(name).decode("utf-8")))
            with open(folder / name, "w", newline="", encoding="utf-8") as file:
                writer = csv.writer(file)
                writer.writerow(["id", "text", "tags"])
                for number, row in enumerate(rows):
                    words = re.findall(r"\w+", row["text"].lower())
                    writer.writerow([number, row["text"], " ".join(map(tag, words))])
    return folder


@pytest.mark.parametrize(
    "answers", [*BASIC_FRAMEWORKS, {"framework": "paddle", "paddle_api": "highlevel"}], ids=lambda a: "-".join(a.values())
)  # fmt: skip
def test_the_readmes_tagging_example_trains_and_its_ragged_values_give_one_f1_on_1_2_and_3_processes(
    bake, tmp_path, answers
):
    project = bake(task="text", **answers)
    data_code, model_code, task_code = readme_example(project, "Example: tagging tokens")
    append(project, "data.py", "\n\n" + data_code)
    append(project, "model.py", "\n\n" + model_code)
    (project / "dist_train" / "task.py").write_text(task_code, encoding="utf-8")
    data, output = tagged_texts(project / "data" / "docstrings.zip", tmp_path / "tagged"), tmp_path / "out"

    train(project, "--data-dir", str(data), "--epochs", "2", "--output-dir", str(output))

    trained = read_metrics(output)[-1]
    assert trained["val_samples"] == TEXT_VAL_SIZE and trained["val_f1"] > 0.5, trained
    for processes in (1, 3):
        result = run(["bash", "run.sh", "--data-dir", str(data), "--evaluate", "--output-dir", str(output)], project,
                     NPROC_PER_NODE=str(processes))  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        evaluated = json.loads((output / "eval.json").read_text(encoding="utf-8"))
        for name in ("val_loss", "val_acc", "val_f1", "val_samples"):
            assert evaluated[name] == pytest.approx(trained[name], rel=1e-6), (processes, name)
    predictions = tmp_path / "tags.csv"
    best = output / "checkpoints" / ("best.pt" if answers["framework"] == "pytorch" else "best.pdparams")
    predicted = run(["bash", "predict.sh", "--checkpoint", str(best), "--input",
                     str(data / "val.csv"), "--output", str(predictions)], project, NPROC_PER_NODE="2")  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    rows = list(csv.DictReader(io.StringIO(predictions.read_text(encoding="utf-8"))))
    truth = list(csv.DictReader(io.StringIO((data / "val.csv").read_text(encoding="utf-8"))))
    assert [len(row["tags"].split()) for row in rows] == [min(128, len(row["tags"].split())) for row in truth]


# Each sample's targets become a dict of boxes (more of them than a batch has images) and its label, and a batch
# holds the list of those dicts first, then the images: what detection datasets give.
TARGETS_FIRST_DATA = """

import numpy as np


class _Detections:
    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        image, label = self.dataset[index]
        return {"targets": {"boxes": np.zeros((index % 5 + 40, 4), "float32"), "label": int(label)}, "images": image}

    @staticmethod
    def collate(samples):
        images = np.ascontiguousarray(np.stack([sample["images"] for sample in samples]))  # as the default collate
        return {"targets": [sample["targets"] for sample in samples], "images": images}

    def __getattr__(self, name):
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


_build_datasets = build_datasets


def build_datasets(args):  # noqa: F811
    train, val, num_classes = _build_datasets(args)
    return _Detections(train), _Detections(val), num_classes
"""
TARGETS_FIRST_TASK = """

_training_loss, _validation_step = training_loss, validation_step


def _images_and_labels(batch):
    labels = [target["label"] for target in batch["targets"]]
    return batch["images"], {to_tensor}(labels, {place}=batch["images"].{device})


def training_loss(model, batch):  # noqa: F811
    return _training_loss(model, _images_and_labels(batch))


def validation_step(model, batch):  # noqa: F811
    return _validation_step(model, _images_and_labels(batch))
"""
TENSORS = {
    "pytorch": {"to_tensor": "__import__('torch').tensor", "place": "device", "device": "device"},
    "paddle": {"to_tensor": "__import__('paddle').to_tensor", "place": "place", "device": "place"},
}


@pytest.mark.parametrize("answers", BASIC_FRAMEWORKS, ids=lambda a: a["framework"])
def test_a_batch_with_per_image_target_dicts_first_counts_its_images_and_trains_as_the_plain_batch(
    bake, tmp_path, answers
):
    project = bake(**answers)
    train(project, "--epochs", "1", "--output-dir", str(tmp_path / "plain"))
    append(project, "data.py", TARGETS_FIRST_DATA)
    append(project, "task.py", TARGETS_FIRST_TASK.format(**TENSORS[answers["framework"]]))

    train(project, "--epochs", "1", "--output-dir", str(tmp_path / "targets"))

    [plain], [targets] = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "targets")
    assert (targets["train_samples"], targets["val_samples"]) == (TRAIN_SIZE, VAL_SIZE)
    for name in ("train_loss", "val_loss", "val_acc"):
        assert targets[name] == pytest.approx(plain[name], rel=1e-6), name
