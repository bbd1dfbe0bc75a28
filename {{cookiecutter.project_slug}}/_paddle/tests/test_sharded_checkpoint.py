"""Checkpoints under --strategy sharding: every rank saves its part of the optimizer state into one folder, and a
resume on any number of processes, under either strategy, gives each rank the whole state or its part of it.

The ranks are real: paddle.distributed.spawn starts them, joined by gloo on the CPU, as run.py's are.
"""

import json
import os
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist
import paddle.nn.functional as F
import pytest
from paddle import nn

from {{ cookiecutter.project_slug }} import checkpoint, distributed, engine, sharding
from {{ cookiecutter.project_slug }}.checkpoint import Checkpointer
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.state import TrainingState

pytestmark = pytest.mark.slow

STAGE_1 = "sharding stage 1"


ACC = ("acc", "max")  # these tests' saves pick best.* by an accuracy


def build(directory: Path, strategy: str) -> Checkpointer:
    """A model of several parameters (each rank's part holds some), Adam, wrapped as run.py wraps them."""
    env = distributed.setup("cpu", timeout_s=120)
    paddle.seed(0)
    with paddle.utils.unique_name.guard():  # the parameters' names, as in a new process
        network = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        model = distributed.wrap_model(network, env, strategy=strategy)
        optimizer = paddle.optimizer.Adam(0.01, parameters=model.parameters())
        schedule = engine.cosine_schedule(optimizer, 10)
    model, optimizer, scaler = distributed.wrap_optimizer(model, optimizer, engine.grad_scaler(None), strategy)
    return Checkpointer(directory, env, model, optimizer, schedule, scaler, best=ACC)


def take_steps(saver: Checkpointer, steps: int = 2) -> None:
    rng = np.random.default_rng(saver.env.rank)
    for _ in range(steps):
        inputs = paddle.to_tensor(rng.standard_normal((8, 4), dtype=np.float32))
        F.cross_entropy(saver.model(inputs), paddle.to_tensor(rng.integers(0, 3, 8))).backward()
        with paddle.utils.unique_name.guard():
            saver.optimizer.step()
        saver.optimizer.clear_grad()


def save_epoch(saver: Checkpointer, epoch: int, acc: float) -> None:
    saver.end_epoch(epoch, {"loss": 1.0, "acc": acc})


def optimizer_state(saver: Checkpointer) -> dict:
    return {key: value.numpy() for key, value in saver.optimizer.state_dict().items() if key != "LR_Scheduler"}


def save_state(out_dir: str, rank: int, state: dict) -> None:
    np.savez(Path(out_dir) / f"rank{rank}.npz", **state)


def read_states(out_dir: Path, world_size: int) -> list[dict]:
    states = []
    for rank in range(world_size):
        with np.load(out_dir / f"rank{rank}.npz") as saved:
            states.append({key: saved[key] for key in saved.files})
    return states


def in_ranks(worker, world_size: int, *args) -> None:
    dist.spawn(worker, args=args, nprocs=world_size, backend="gloo")


def train_and_save_two_epochs(directory: str, out_dir: str) -> None:
    saver = build(Path(directory), STAGE_1)
    saver.resume("none")
    saver.keep_best = 1
    take_steps(saver)
    save_epoch(saver, 1, 0.9)  # the best
    take_steps(saver)
    save_epoch(saver, 2, 0.5)
    save_state(out_dir, saver.env.rank, optimizer_state(saver))


def resume_and_report(directory: str, out_dir: str, strategy: str) -> None:
    saver = build(Path(directory), strategy)
    saver.resume("auto")
    save_state(out_dir, saver.env.rank, optimizer_state(saver))


def save_with_a_full_disk_on_rank_1(directory: str, out_dir: str) -> None:
    saver = build(Path(directory), STAGE_1)
    saver.resume("none")
    take_steps(saver)
    save_epoch(saver, 1, 0.9)
    real_save = checkpoint.paddle.save

    def full_on_rank_1(obj, path):
        if path.endswith("optimizer-1.pdopt"):
            raise OSError(28, "No space left on device")
        real_save(obj, path)

    checkpoint.paddle.save = full_on_rank_1
    take_steps(saver)
    try:
        save_epoch(saver, 2, 0.95)
    except UserError as error:
        Path(out_dir, f"error{saver.env.rank}.txt").write_text(str(error), encoding="utf-8")


def average_and_save(directory: str, out_dir: str) -> None:
    """A run of --ema 0.9 under stage 1: each rank reports its averages."""
    saver = build(Path(directory), STAGE_1)
    saver.ema = engine.Ema(saver.model, 0.9)
    saver.resume("none")
    for _ in range(3):
        take_steps(saver, 1)
        saver.ema.update()
    save_epoch(saver, 1, 0.9)
    save_state(out_dir, saver.env.rank, {name: value.numpy() for name, value in saver.ema.averages.items()})


@pytest.fixture
def folders(tmp_path) -> tuple[Path, Path]:
    (tmp_path / "out").mkdir()
    return tmp_path / "checkpoints", tmp_path / "out"


def test_each_rank_saves_its_part_into_a_folder_the_links_switch_to_and_one_process_resumes_the_whole(folders):
    directory, out = folders
    in_ranks(train_and_save_two_epochs, 2, str(directory), str(out))
    parts = read_states(out, 2)

    saves = sorted(directory.glob("save-*"))
    assert len(saves) == 2  # epoch 2's (last) and epoch 1's (best); no other
    assert (directory / "last").resolve() == saves[1] and (directory / "best").resolve() == saves[0]
    assert json.loads((directory / "top.json").read_text()) == [{"epoch": 1, "value": 0.9, "path": saves[0].name}]
    assert sorted(path.name for path in saves[1].iterdir()) == [
        "model.pdparams", "optimizer-0.pdopt", "optimizer-1.pdopt", "training.pdopt"
    ]  # fmt: skip
    assert parts[0].keys().isdisjoint(parts[1].keys()) and parts[0] and parts[1]  # each rank holds a part

    saver = build(directory, "ddp")  # one process, no launcher: the whole state, both parts merged
    assert saver.resume("auto") == TrainingState(2, 0.9, best_metric="acc", best_mode="max", stale_epochs=1)
    whole = optimizer_state(saver)
    assert whole.keys() == parts[0].keys() | parts[1].keys()
    for part in parts:
        for key, value in part.items():
            np.testing.assert_array_equal(whole[key], value)


def test_a_data_parallel_checkpoint_resumes_under_sharding_on_three_ranks_each_keeping_its_part(folders):
    directory, out = folders
    saver = build(directory, "ddp")
    saver.resume("none")
    take_steps(saver)
    save_epoch(saver, 1, 0.7)
    whole = optimizer_state(saver)

    in_ranks(resume_and_report, 3, str(directory), str(out), STAGE_1)
    parts = read_states(out, 3)

    assert set().union(*(part.keys() for part in parts)) == whole.keys()
    assert sum(len(part) for part in parts) == len(whole)  # no state kept twice
    for part in parts:
        for key, value in part.items():
            np.testing.assert_array_equal(value, whole[key])


def test_a_full_disk_on_one_rank_is_one_line_on_every_rank_and_leaves_the_last_save_as_it_was(folders):
    directory, out = folders
    in_ranks(save_with_a_full_disk_on_rank_1, 2, str(directory), str(out))

    errors = [(out / f"error{rank}.txt").read_text(encoding="utf-8") for rank in range(2)]
    assert all(error.startswith("no space left in") for error in errors)
    assert len(list(directory.glob("save-*"))) == 1  # the failed save's folder is gone
    training = paddle.load(str(directory / "last" / "training.pdopt"))
    assert training["epoch"] == 1


def test_stages_2_and_3_are_refused_on_cpus_in_one_line_that_says_what_runs_there():
    for stage in (2, 3):
        with pytest.raises(UserError, match=f"--sharding-stage {stage}: .* GPUs only .* --sharding-stage 1"):
            sharding.check_device(f"sharding stage {stage}", on_gpu=False)
    sharding.check_device("sharding stage 1", on_gpu=False)
    sharding.check_device("sharding stage 3", on_gpu=True)


def test_a_sharded_save_exports_and_predicts_as_a_file(folders, tmp_path):
    directory, out = folders
    in_ranks(train_and_save_two_epochs, 2, str(directory), str(out))

    exported = checkpoint.export_weights(directory / "best", tmp_path / "model.pdparams")

    weights, data = checkpoint.read_weights(directory / "best")
    assert sorted(paddle.load(str(exported))) == sorted(weights)
    assert json.loads(exported.with_suffix(".json").read_text(encoding="utf-8")) == data
    assert checkpoint.newest(directory, checkpoint.BEST) == directory / "best"
    os.utime(directory / "best" / "training.pdopt", (1, 1))  # a file form newer than the folder wins
    paddle.save(weights, str(directory / checkpoint.BEST))
    assert checkpoint.newest(directory, checkpoint.BEST) == directory / checkpoint.BEST


def test_under_stage_1_every_rank_averages_the_whole_parameters_which_the_save_holds_beside_the_weights(folders):
    directory, out = folders
    in_ranks(average_and_save, 2, str(directory), str(out))
    ranks = read_states(out, 2)

    assert ranks[0].keys() == ranks[1].keys() == set(paddle.load(str(directory / "best" / "model.pdparams")))
    for name, average in ranks[0].items():
        np.testing.assert_array_equal(ranks[1][name], average)  # the same whole average on every rank
    assert (directory / "best" / "ema.pdparams").is_file()
    for name, average in checkpoint.read_weights(directory / "best")[0].items():
        np.testing.assert_array_equal(average.numpy(), ranks[0][name])  # predict.py's and export.py's weights
    saver = build(directory, "ddp")  # one process: the averages go on
    saver.ema = engine.Ema(saver.model, None)
    assert saver.resume("auto").ema_decay == 0.9
    for name, average in saver.ema.averages.items():
        np.testing.assert_array_equal(average.numpy(), ranks[0][name])
