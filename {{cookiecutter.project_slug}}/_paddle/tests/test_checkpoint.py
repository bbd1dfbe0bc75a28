"""Checkpoints are a consistent pair that holds everything a resumed run needs and never a broken file."""

import json
import logging
import math
import os
import warnings

import numpy as np
import paddle
import pytest
from checkpointers import (
    LAST_FILES,
    assert_same_weights,
    averages_of,
    build_checkpointer,
    take_averaged_steps,
    take_steps,
    weights_of,
)
from conftest import acc_state, averaging, save_epoch
from paddle import nn

from {{ cookiecutter.project_slug }} import checkpoint, engine
from {{ cookiecutter.project_slug }}.checkpoint import Checkpointer
from {{ cookiecutter.project_slug }}.distributed import DistEnv
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.preemption import EpochProgress

FILES = ["last.json", *LAST_FILES]  # and the data description, for predict.py


def test_the_two_best_epochs_are_kept_and_listed_best_first_and_resume_auto_takes_the_last(tmp_path):
    saver = build_checkpointer(tmp_path)
    saver.keep_best = 2
    for epoch, acc in enumerate([0.5, 0.7, 0.6, 0.4], start=1):
        take_steps(saver, 1, seed=epoch)
        saver.end_epoch(epoch, {"loss": 1.0, "acc": acc})

    top = json.loads((tmp_path / "top.json").read_text())
    assert top == [
        {"epoch": 2, "value": 0.7, "path": "epoch-2.pdparams"}, {"epoch": 3, "value": 0.6, "path": "epoch-3.pdparams"}
    ]  # fmt: skip
    assert sorted(path.name for path in tmp_path.glob("epoch-*")) == [
        "epoch-2.json", "epoch-2.pdopt", "epoch-2.pdparams", "epoch-3.json", "epoch-3.pdopt", "epoch-3.pdparams"
    ]  # fmt: skip
    assert_same_weights(paddle.load(str(tmp_path / "epoch-2.pdparams")), paddle.load(str(tmp_path / "best.pdparams")))
    assert build_checkpointer(tmp_path).resume("auto").epochs_done == 4


def test_last_checkpoint_is_weights_and_training_state_that_paddle_load_reads_and_the_data_in_json(tmp_path):
    saver = build_checkpointer(tmp_path)
    take_steps(saver)

    save_epoch(saver, 3, 0.5, False)

    assert sorted(p.name for p in tmp_path.iterdir()) == FILES
    assert_same_weights(weights_of(saver.model), paddle.load(str(tmp_path / "last.pdparams")))
    state = paddle.load(str(tmp_path / "last.pdopt"))
    assert {"optimizer", "scaler", "epoch", "best_metric", "best_mode", "best_value", "rng"} <= state.keys()
    assert state["epoch"] == 3
    assert (state["best_metric"], state["best_mode"], state["best_value"]) == ("acc", "max", 0.5)
    assert state["optimizer"]["LR_Scheduler"]["last_epoch"] == 3
    assert any(key.endswith("velocity_0") for key in state["optimizer"]), "momentum buffers are missing"
    assert saver.last_path == tmp_path / "last.pdparams"
    assert json.loads((tmp_path / "last.json").read_text()) == saver.data


def test_weights_saved_from_a_data_parallel_model_have_no_wrapper_prefix(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "return to single-card operation": one process is enough here
        saver = build_checkpointer(tmp_path, wrap=paddle.DataParallel)
    assert isinstance(saver.model, paddle.DataParallel)

    save_epoch(saver, 1, 0.1, False)

    weights = paddle.load(str(tmp_path / "last.pdparams"))
    assert sorted(weights) == ["bias", "weight"]
    fresh = nn.Linear(4, 3)
    assert fresh.set_state_dict(weights) == ([], [])  # the user's own model takes them as they are
    assert_same_weights(weights_of(fresh), weights_of(saver.model))


def test_a_checkpoint_from_before_task_py_resumes_its_best_as_accuracy(tmp_path):
    save_epoch(build_checkpointer(tmp_path), 2, 0.75, True)
    state = paddle.load(str(tmp_path / "last.pdopt"))
    older = {key: value for key, value in state.items() if not key.startswith("best_")}
    paddle.save({**older, "best_acc": 0.75}, str(tmp_path / "last.pdopt"))  # as the template wrote it before task.py

    resumed = build_checkpointer(tmp_path).resume("auto")

    assert resumed == acc_state(2, 0.75, EpochProgress())


def test_a_checkpoint_of_the_per_epoch_schedule_resumes_at_the_rate_of_its_epochs_done(tmp_path):
    save_epoch(build_checkpointer(tmp_path), 2, 0.75, True)
    state = paddle.load(str(tmp_path / "last.pdopt"))
    older = {key: value for key, value in state.items() if key not in ("position", "warmup_epochs")}
    paddle.save(older, str(tmp_path / "last.pdopt"))  # as the template wrote it before the schedule stepped per step

    resumer = build_checkpointer(tmp_path)
    resumer.resume("auto")

    assert (resumer.schedule.position, resumer.schedule.warmup) == (2, 0.0)
    rate = resumer.optimizer.get_lr()
    assert rate == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 2 / 10)))  # epoch 3's rate of a 10-epoch cosine


@pytest.mark.parametrize("name", ["last.pdparams", "last.pdopt", "last"])
def test_resume_from_an_explicit_path_loads_that_pair(tmp_path, name):
    save_epoch(build_checkpointer(tmp_path / "old"), 5, 0.6, False)

    resumed = build_checkpointer(tmp_path / "new").resume(str(tmp_path / "old" / name))
    assert resumed == acc_state(5, 0.6, EpochProgress(), stale_epochs=1)  # (epoch 5 was not the best)


def test_weights_without_their_training_state_are_refused(tmp_path):
    save_epoch(build_checkpointer(tmp_path), 1, 0.1, False)
    (tmp_path / "last.pdopt").unlink()

    with pytest.raises(UserError, match="last.pdopt") as error:
        build_checkpointer(tmp_path).resume("auto")
    assert "not a checkpoint written by run.py" in str(error.value)


def test_best_checkpoint_is_written_only_when_the_epoch_is_the_best(tmp_path):
    saver = build_checkpointer(tmp_path)

    def epoch_in(name: str) -> int:
        return paddle.load(str(tmp_path / name))["epoch"]

    save_epoch(saver, 1, 0.5, True)
    assert epoch_in("best.pdopt") == 1

    save_epoch(saver, 2, 0.5, False)
    assert epoch_in("best.pdopt") == 1
    assert epoch_in("last.pdopt") == 2

    take_steps(saver)
    save_epoch(saver, 3, 0.8, True)
    assert epoch_in("best.pdopt") == 3
    assert_same_weights(paddle.load(str(tmp_path / "best.pdparams")), weights_of(saver.model))


def test_first_epoch_that_is_not_the_best_writes_no_best_checkpoint(tmp_path):
    save_epoch(build_checkpointer(tmp_path), 1, 0.0, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == FILES


def test_saving_leaves_no_temporary_file(tmp_path):
    saver = build_checkpointer(tmp_path)
    for epoch in (1, 2, 3):
        save_epoch(saver, epoch, 0.1 * epoch, True)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "best.pdopt", "best.pdparams", *FILES]


def test_a_full_disk_while_writing_keeps_the_previous_pair_leaves_no_temporary_file_and_says_so(tmp_path, monkeypatch):
    saver = build_checkpointer(tmp_path)
    save_epoch(saver, 1, 0.5, True)
    weights_at_1 = weights_of(saver.model)
    take_steps(saver)
    real_save = checkpoint.paddle.save

    def disk_full_on_the_second_file(obj, path):
        if path.endswith(".pdopt"):
            raise OSError(28, "No space left on device")
        real_save(obj, path)

    monkeypatch.setattr(checkpoint.paddle, "save", disk_full_on_the_second_file)
    with pytest.raises(UserError, match="no space left in"):
        save_epoch(saver, 2, 0.9, True)
    monkeypatch.undo()

    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "best.pdopt", "best.pdparams", *FILES]
    assert paddle.load(str(tmp_path / "last.pdopt"))["epoch"] == 1
    assert_same_weights(paddle.load(str(tmp_path / "last.pdparams")), weights_at_1)
    assert build_checkpointer(tmp_path).resume("auto") == acc_state(1, 0.5, EpochProgress())


def test_crash_between_the_two_renames_is_completed_at_the_next_start(tmp_path, monkeypatch):
    saver = build_checkpointer(tmp_path)
    save_epoch(saver, 1, 0.5, False)
    take_steps(saver)
    weights_at_2 = weights_of(saver.model)
    real_replace = os.replace
    calls = []

    def crash_after_the_first_file_of_the_pair(source, destination):
        if any(str(done).endswith(tuple(LAST_FILES)) for done in calls):
            raise KeyboardInterrupt  # the job is killed mid-save
        calls.append(destination)
        real_replace(source, destination)

    monkeypatch.setattr(checkpoint.os, "replace", crash_after_the_first_file_of_the_pair)
    with pytest.raises(KeyboardInterrupt):
        save_epoch(saver, 2, 0.5, False)
    monkeypatch.undo()
    new_state = paddle.load(str(tmp_path / "last.pdopt"))["epoch"] == 2
    new_weights = np.array_equal(paddle.load(str(tmp_path / "last.pdparams"))["weight"].numpy(), weights_at_2["weight"])
    assert new_state != new_weights  # one file of the pair on disk is new, the other old ...

    resumer = build_checkpointer(tmp_path)
    # ... and the next start finishes the save first
    assert resumer.resume("auto") == acc_state(2, 0.5, EpochProgress(), stale_epochs=1)

    assert_same_weights(weights_of(resumer.model), weights_at_2)
    assert sorted(p.name for p in tmp_path.iterdir()) == FILES


def test_a_plain_state_dict_is_not_taken_for_a_checkpoint(tmp_path):
    paddle.save(nn.Linear(4, 3).state_dict(), str(tmp_path / "weights.pdparams"))

    with pytest.raises(UserError, match="not a checkpoint written by run.py"):
        build_checkpointer(tmp_path).resume(str(tmp_path / "weights.pdparams"))


def test_training_state_without_the_keys_run_py_writes_is_not_taken_for_a_checkpoint(tmp_path):
    saver = build_checkpointer(tmp_path)
    take_steps(saver)
    paddle.save(saver.model.state_dict(), str(tmp_path / "mine.pdparams"))
    paddle.save(saver.optimizer.state_dict(), str(tmp_path / "mine.pdopt"))  # the optimizer's alone

    with pytest.raises(UserError, match="not a checkpoint written by run.py") as error:
        build_checkpointer(tmp_path).resume(str(tmp_path / "mine.pdparams"))
    assert "epoch" in str(error.value)


# ------------------------------------------------------------------ checkpoints move between GPUs and CPUs

GPU1 = DistEnv(rank=0, local_rank=1, world_size=1, device="gpu:1")


def generator_states(count: int) -> list:
    """Stand-ins for GPU generator states: CPU generator states of distinct seeds (the same type)."""
    states = []
    for seed in range(count):
        paddle.seed(100 + seed)
        states.append(paddle.get_rng_state("cpu")[0])
    return states


def fake_gpus(monkeypatch, states: list) -> dict:
    """paddle's GPU random-stream API, on a machine with len(states) GPUs; what is set is recorded."""
    get, given = paddle.get_rng_state, {}

    def get_rng_state(device=None):
        return list(states) if device == "gpu" else get(device)

    monkeypatch.setattr(paddle, "get_rng_state", get_rng_state)
    set_ = paddle.set_rng_state
    monkeypatch.setattr(
        paddle, "set_rng_state", lambda s, device=None: given.update(gpu=s) if device == "gpu" else set_(s, device)
    )
    return given


def checkpointer_on_gpu1(tmp_path, monkeypatch, gpus: int) -> tuple[Checkpointer, list, dict]:
    """A checkpointer of rank 0 on GPU 1 of a machine with `gpus` GPUs; with their random streams (stand-ins)
    and what is set on them (fake_gpus)."""
    states = generator_states(gpus)
    given = fake_gpus(monkeypatch, states)
    return build_checkpointer(tmp_path, env=GPU1), states, given


def test_a_gpu_run_saves_its_own_gpus_random_stream_only(tmp_path, monkeypatch):
    saver, states, _ = checkpointer_on_gpu1(tmp_path, monkeypatch, gpus=2)

    save_epoch(saver, 1, 0.5, True)

    saved = paddle.load(str(tmp_path / "last.pdopt"))["rng"][0]["gpu"]
    assert saved.current_seed() == states[1].current_seed()


def test_a_resume_on_a_machine_with_another_number_of_gpus_sets_this_ranks_own_stream(tmp_path, monkeypatch):
    saver, saved_states, _ = checkpointer_on_gpu1(tmp_path, monkeypatch, gpus=2)
    save_epoch(saver, 1, 0.5, True)
    resumer, now, given = checkpointer_on_gpu1(tmp_path, monkeypatch, gpus=4)  # the resuming machine has 4 GPUs

    assert resumer.resume("auto").epochs_done == 1

    assert [state.current_seed() for state in given["gpu"]] == [
        now[0].current_seed(), saved_states[1].current_seed(), now[2].current_seed(), now[3].current_seed()
    ]  # fmt: skip


def test_a_gpu_checkpoint_resumes_on_the_cpu(tmp_path, monkeypatch):
    saver, _, _ = checkpointer_on_gpu1(tmp_path, monkeypatch, gpus=2)
    take_steps(saver)
    save_epoch(saver, 2, 0.75, True)
    monkeypatch.undo()

    resumer = build_checkpointer(tmp_path)

    assert resumer.resume("auto") == acc_state(2, 0.75, EpochProgress())
    assert_same_weights(weights_of(resumer.model), weights_of(saver.model))


def test_a_cpu_run_never_asks_for_gpu_random_streams(tmp_path, monkeypatch):
    get, set_ = paddle.get_rng_state, paddle.set_rng_state
    monkeypatch.setattr(
        paddle, "get_rng_state", lambda device=None: get(device) if device == "cpu" else pytest.fail(device)
    )
    monkeypatch.setattr(
        paddle, "set_rng_state", lambda s, device=None: set_(s, device) if device == "cpu" else pytest.fail(device)
    )
    saver = build_checkpointer(tmp_path)

    save_epoch(saver, 1, 0.5, True)

    assert build_checkpointer(tmp_path).resume("auto").epochs_done == 1


def test_a_checkpoint_without_loss_scaling_resumes_a_run_with_it_on_a_fresh_scaler(tmp_path):
    saver = build_checkpointer(tmp_path)  # its scaler is off, as on a CPU or with --no-amp
    save_epoch(saver, 1, 0.5, True)
    assert paddle.load(str(tmp_path / "last.pdopt"))["scaler"] == {}
    resumer = build_checkpointer(tmp_path)
    resumer.scaler._enable = True  # as on a GPU (paddle turns a scaler off on the CPU)

    assert resumer.resume("auto").epochs_done == 1

    assert resumer.scaler._init_loss_scaling == paddle.amp.GradScaler(enable=False)._init_loss_scaling


def test_the_average_moves_one_minus_decay_towards_the_weights_and_statistics_at_each_step_in_float32(tmp_path):
    saver = averaging(build_checkpointer(tmp_path, wrap=lambda linear: nn.Sequential(linear, nn.BatchNorm1D(3))))
    saver.resume("none")  # the average starts at the weights
    before = averages_of(saver)

    take_averaged_steps(saver, 1)

    weights = weights_of(saver.model)
    assert sorted(before) == sorted(weights) and "1._mean" in weights  # batch norm's statistics too
    for name, average in saver.ema.averages.items():
        assert average.dtype == paddle.float32
        np.testing.assert_allclose(average.numpy(), 0.9 * before[name] + 0.1 * weights[name], rtol=1e-6, atol=1e-7)


def test_a_stop_saves_both_weights_and_its_resume_goes_on_averaging_as_if_never_stopped(tmp_path, caplog):
    saver = averaging(build_checkpointer(tmp_path))
    saver.resume("none")
    take_averaged_steps(saver, 2)
    saver.save_progress(EpochProgress(step=2, consumed=16))  # as a SIGTERM stop saves
    assert_same_weights(paddle.load(str(tmp_path / "last.pdema")), averages_of(saver))
    # predict.py and export.py: the averages, or with --weights raw the trained weights.
    assert_same_weights(checkpoint.read_weights(tmp_path / "last.pdparams")[0], averages_of(saver))
    assert_same_weights(checkpoint.read_weights(tmp_path / "last.pdparams", averaged=False)[0], weights_of(saver.model))
    take_averaged_steps(saver, 2, seed=5)  # the uninterrupted run

    resumed = averaging(build_checkpointer(tmp_path), decay=None)  # resumed without --ema
    with caplog.at_level(logging.INFO):
        assert resumed.resume("auto").ema_decay == 0.9
    take_averaged_steps(resumed, 2, seed=5)

    assert "this run goes on with the resumed run's --ema 0.9" in caplog.text
    assert_same_weights(averages_of(resumed), averages_of(saver))


def test_ema_on_a_resume_of_a_checkpoint_without_averages_starts_them_at_its_weights_and_says_so(tmp_path, caplog):
    saver = build_checkpointer(tmp_path)  # a run without --ema, or of a version before it
    take_steps(saver)
    save_epoch(saver, 1, 0.5, True)
    assert not (tmp_path / "last.pdema").exists()

    resumed = averaging(build_checkpointer(tmp_path), 0.99)
    with caplog.at_level(logging.INFO):
        resumed.resume("auto")

    assert "the checkpoint holds no averaged weights; the average starts at its weights" in caplog.text
    assert_same_weights(averages_of(resumed), weights_of(saver.model))


def test_a_new_run_without_ema_in_the_folder_of_one_with_it_leaves_no_averages_for_predict_to_take(tmp_path):
    averaged = averaging(build_checkpointer(tmp_path))
    averaged.resume("none")
    take_averaged_steps(averaged)
    save_epoch(averaged, 1, 0.5, True)

    fresh = averaging(build_checkpointer(tmp_path), None)
    fresh.resume("none")
    take_steps(fresh)
    save_epoch(fresh, 1, 0.5, True)

    for name in ("last", "best"):
        assert_same_weights(checkpoint.read_weights(tmp_path / f"{name}.pdparams")[0], weights_of(fresh.model))


def test_ema_under_sharding_stages_2_and_3_is_refused_in_one_line(tmp_path):
    class GroupShardedStage3(nn.Layer):  # the name of group_sharded_parallel()'s wrapper (GPUs only)
        def __init__(self, layer):
            super().__init__()
            self._layer = layer

    with pytest.raises(UserError, match="--ema under --sharding-stage 2 or 3 is not supported yet"):
        engine.Ema(GroupShardedStage3(nn.Linear(4, 3)), 0.9).start()
