"""What a checkpoint resumes, and the averaged weights (--ema) beside its model, asked alike of both frameworks'
Checkpointer (checkpointers.py builds the framework's); test_checkpoint.py holds what only one framework's files,
tensors and devices show."""

from pathlib import Path

import numpy as np
import pytest
from checkpointers import (
    CPU,
    LAST_FILES,
    RANKS_DISAGREE,
    assert_same_optimizer,
    assert_same_weights,
    averages_of,
    build_checkpointer,
    draw_random_numbers,
    learning_rates,
    take_averaged_steps,
    take_steps,
    weights_of,
)
from conftest import acc_state, averaging, save_epoch

from {{ cookiecutter.project_slug }} import checkpoint, engine, output_folder
from {{ cookiecutter.project_slug }}.distributed import DistEnv
from {{ cookiecutter.project_slug }}.engine import seed_everything
from {{ cookiecutter.project_slug }}.errors import UserError
from {{ cookiecutter.project_slug }}.preemption import EpochProgress, Stopped


def test_resume_restores_epoch_best_accuracy_optimizer_schedule_and_random_streams(tmp_path):
    seed_everything(1)
    saver = build_checkpointer(tmp_path)
    take_steps(saver)
    save_epoch(saver, 2, 0.75, True)
    numbers_after_save = draw_random_numbers()

    seed_everything(2)  # a new process: other weights, other random streams
    resumer = build_checkpointer(tmp_path)
    assert not np.array_equal(weights_of(resumer.model)["weight"], weights_of(saver.model)["weight"])

    assert resumer.resume("auto") == acc_state(2, 0.75, EpochProgress())

    assert draw_random_numbers() == numbers_after_save
    assert_same_weights(weights_of(resumer.model), weights_of(saver.model))
    assert resumer.schedule.position == saver.schedule.position == pytest.approx(0.3)  # take_steps()'s 3 tenths
    assert_same_optimizer(resumer, saver)


def test_a_stop_checkpoint_resumes_part_way_into_the_next_epoch(tmp_path):
    saver = build_checkpointer(tmp_path)
    saver.state = acc_state(2, 0.5)
    saver.save_stopped(Stopped(3, EpochProgress(7, 3.25, 112)))

    assert build_checkpointer(tmp_path).resume("auto") == acc_state(2, 0.5, EpochProgress(7, 3.25, 112))


def test_saves_every_n_steps_fall_on_every_nth_optimizer_step_and_only_when_asked(tmp_path):
    saver = build_checkpointer(tmp_path)
    assert not any(saver.due(step) for step in range(1, 20))

    saver.every_steps = 5
    assert [step for step in range(1, 20) if saver.due(step)] == [5, 10, 15]


def test_a_step_save_is_a_mid_epoch_checkpoint_that_resumes_where_it_was(tmp_path):
    saver = build_checkpointer(tmp_path)
    saver.state = acc_state(2, 0.5)
    saver.save_progress(EpochProgress(10, 4.5, 160, consumed=320))

    assert build_checkpointer(tmp_path).resume("auto") == acc_state(2, 0.5, EpochProgress(10, 4.5, 160, 320))


def save_of_two_ranks(directory, monkeypatch) -> None:
    """A mid-epoch checkpoint as two ranks write it: 10 batches of 16 each, 320 samples of the epoch's order."""
    saver = build_checkpointer(directory)
    saver.state = acc_state(2, 0.5)
    with monkeypatch.context() as patch:
        ranks = lambda mine: [mine, (mine[0], EpochProgress(10, 5.5, 160, 320).to_dict())]  # noqa: E731
        patch.setattr(checkpoint.distributed, "all_gather_object", ranks)
        saver.save_progress(EpochProgress(10, 4.5, 160, 320))


@pytest.mark.parametrize("world_size", [1, 3])
def test_a_mid_epoch_checkpoint_goes_on_on_another_number_of_processes_from_the_same_place(
    tmp_path, monkeypatch, world_size
):
    save_of_two_ranks(tmp_path, monkeypatch)
    monkeypatch.setattr(checkpoint.distributed, "all_gather_object", lambda point: [point] * world_size)
    ranks = [DistEnv(rank, rank, world_size, CPU.device) for rank in range(world_size)]

    progress = [build_checkpointer(tmp_path, env=env).resume("auto").progress for env in ranks]

    # Each rank from its first batch of the rest of the epoch; rank 0 carries the loss so far, as all ranks sum it.
    assert progress[0] == EpochProgress(0, 10.0, 320, consumed=320)
    assert all(rank == EpochProgress(0, 0.0, 0, consumed=320) for rank in progress[1:])


def test_resume_auto_without_a_checkpoint_starts_afresh(tmp_path):
    assert build_checkpointer(tmp_path / "empty").resume("auto") == acc_state(0, None, EpochProgress())


def test_resume_none_starts_afresh_even_when_a_checkpoint_exists(tmp_path):
    save_epoch(build_checkpointer(tmp_path), 4, 0.9, False)
    fresh = build_checkpointer(tmp_path)
    weights = weights_of(fresh.model)

    assert fresh.resume("none") == acc_state(0, None, EpochProgress())
    assert_same_weights(weights_of(fresh.model), weights)


def test_resume_from_a_missing_path_says_so(tmp_path):
    missing = tmp_path / f"nope{Path(checkpoint.LAST).suffix}"  # nope.pt, nope.pdparams
    with pytest.raises(UserError, match="not found") as error:
        build_checkpointer(tmp_path).resume(str(missing))
    assert str(missing) in str(error.value)


def test_a_mistyped_resume_choice_is_told_the_choices(tmp_path):
    with pytest.raises(UserError, match="not found: pass --resume auto, none, or an existing"):
        build_checkpointer(tmp_path).resume("atuo")


def test_checkpoint_of_a_different_model_is_refused_naming_the_mismatch(tmp_path):
    save_epoch(build_checkpointer(tmp_path, out_features=3), 1, 0.1, False)
    other = build_checkpointer(tmp_path, out_features=5)

    with pytest.raises(UserError, match="does not match the model") as error:
        other.resume("auto")

    message = str(error.value)
    assert "weight" in message and "size mismatch" in message
    # The advice keeps the earlier checkpoints: a save of this model, or a new folder, not --resume none over them.
    assert "resume one of this model's" in message and "new --output-dir" in message and "--resume none" not in message
    assert "\n" not in message


@pytest.mark.parametrize("name", LAST_FILES)
@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_checkpoint_is_a_user_error_not_a_traceback(tmp_path, damage, name):
    save_epoch(build_checkpointer(tmp_path), 1, 0.1, False)
    path = tmp_path / name
    data = path.read_bytes()
    damaged = {"garbage": b"\x80\x02not a checkpoint" * 10, "truncated": data[: len(data) // 2], "empty": b""}
    path.write_bytes(damaged[damage])

    with pytest.raises(UserError, match="corrupt") as error:
        build_checkpointer(tmp_path).resume("auto")
    assert str(path) in str(error.value)
    # The advice keeps the earlier checkpoints: best.* or a new folder, not --resume none over them.
    assert str(tmp_path / checkpoint.BEST) in str(error.value) and "--resume none" not in str(error.value)


@pytest.mark.parametrize("folder", ["checkpoints", "empty"])
def test_a_folder_that_is_not_a_save_is_one_line_naming_the_files_to_pass(tmp_path, folder):
    """export.py or predict.py given a run's checkpoints/ (or any folder) instead of one of its saves."""
    given = tmp_path / folder
    if folder == "checkpoints":
        save_epoch(build_checkpointer(given), 1, 0.1, True)
    given.mkdir(exist_ok=True)

    with pytest.raises(UserError, match="is a folder but not a save run.py wrote") as error:
        checkpoint.export_weights(given, tmp_path / f"model{Path(checkpoint.LAST).suffix}")
    message = str(error.value)
    assert str(given) in message and Path(checkpoint.BEST).name in message and "\n" not in message
    assert "corrupt" not in message and "--resume" not in message
    assert not list(tmp_path.glob("model*"))  # nothing written
    with pytest.raises(UserError, match="is a folder but not a save run.py wrote"):  # --resume FOLDER: alike
        build_checkpointer(tmp_path / "run").resume(str(given))


@pytest.mark.parametrize("given", ["theirs", "ours, missing beside theirs"])
def test_the_other_frameworks_checkpoint_is_one_line_saying_whose_it_is(tmp_path, given):
    ours = Path(checkpoint.BEST).suffix
    theirs = next(suffix for suffix in output_folder.SUFFIXES if suffix != ours)
    (tmp_path / f"best{theirs}").write_bytes(b"\x80\x04 the other framework's pickle")

    path = tmp_path / (f"best{theirs}" if given == "theirs" else f"best{ours}")
    with pytest.raises(UserError, match=f"is a {output_folder.SUFFIXES[theirs]} checkpoint") as error:
        checkpoint.read_weights(path)
    assert str(tmp_path / f"best{theirs}") in str(error.value) and "corrupt" not in str(error.value)
    with pytest.raises(UserError, match="not found"):  # a missing file of theirs is just missing
        checkpoint.read_weights(tmp_path / f"missing{theirs}")
    if given == "theirs":  # --resume FILE: alike
        with pytest.raises(UserError, match=f"is a {output_folder.SUFFIXES[theirs]} checkpoint"):
            build_checkpointer(tmp_path / "run").resume(str(path))


def test_ranks_that_find_different_checkpoints_stop_instead_of_training_different_models(tmp_path, monkeypatch):
    save_epoch(build_checkpointer(tmp_path), 2, 0.5, False)
    # What rank 0 sees beside a machine whose --output-dir holds no checkpoint.
    monkeypatch.setattr(checkpoint.distributed, "all_gather_object", lambda point: [point, (0, 0)])

    with pytest.raises(UserError, match=RANKS_DISAGREE) as error:
        build_checkpointer(tmp_path).resume("auto")

    assert "shared filesystem" in str(error.value)


def test_a_resumed_run_with_more_epochs_follows_the_longer_schedule(tmp_path):
    fresh = learning_rates(tmp_path, 4, range(1, 5), resume="none")
    first_two = learning_rates(tmp_path, 2, range(1, 3), resume="none")
    last_two = learning_rates(tmp_path, 4, range(3, 5), resume="auto")

    assert first_two == pytest.approx([0.1, 0.05])  # the 2-epoch schedule it was started with
    assert last_two == pytest.approx(fresh[2:])
    assert min(last_two) > 0


def test_a_rate_given_on_resume_is_the_one_the_tasks_optimizer_makes_of_it(tmp_path):
    # An optimizer that takes a fifth of --lr, as segmentation's AdamW does: started at --lr 0.1, resumed with 0.5.
    saver = build_checkpointer(tmp_path, lr=0.02)
    saver.resume("none")
    save_epoch(saver, 1, 0.5, True)
    resumed = build_checkpointer(tmp_path, lr=0.1)  # what build_optimizer() makes of --lr 0.5

    resumed.resume("auto", lr=0.5)

    assert engine.epoch_rate(resumed.optimizer, None, 2) == pytest.approx(0.1)  # not --lr's 0.5 itself


def test_ema_0_averages_to_exactly_the_weights(tmp_path):
    saver = averaging(build_checkpointer(tmp_path), 0.0)
    saver.resume("none")
    take_averaged_steps(saver)
    assert_same_weights(averages_of(saver), weights_of(saver.model))


def test_validation_sees_the_averages_in_the_models_own_tensors_and_training_goes_on_with_its_weights(tmp_path):
    saver = averaging(build_checkpointer(tmp_path))
    saver.resume("none")
    take_averaged_steps(saver)
    weight, trained = saver.model.weight, weights_of(saver.model)

    with saver.ema.swapped():
        assert saver.model.weight is weight  # in place: no second model
        assert_same_weights(weights_of(saver.model), averages_of(saver))
    assert_same_weights(weights_of(saver.model), trained)
    assert not np.array_equal(trained["weight"], averages_of(saver)["weight"])


def test_a_run_resumed_from_another_folder_has_that_runs_best_until_an_epoch_beats_it(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    saver = build_checkpointer(first)
    save_epoch(saver, 1, 0.75, True)
    save_epoch(saver, 2, 0.75, False)
    resumer = build_checkpointer(second)
    resumer.resume(str(first / checkpoint.LAST))

    resumer.end_epoch(3, {"loss": 1.0, "acc": 0.5})  # not better than epoch 1

    best_files = sorted(path.name for path in first.glob("best.*"))  # (Paddle's: the weights, optimizer, state)
    assert sorted(path.name for path in second.glob("best.*")) == best_files
    assert all((second / name).read_bytes() == (first / name).read_bytes() for name in best_files)
    take_steps(resumer)
    resumer.end_epoch(4, {"loss": 1.0, "acc": 0.9})  # better: its own weights
    assert (second / checkpoint.BEST).read_bytes() != (first / checkpoint.BEST).read_bytes()
    assert resumer.state.best_value == 0.9


def test_a_sharded_best_in_another_folder_is_copied_as_a_save_of_its_own(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    (first / "save-1").mkdir(parents=True)
    (first / "save-1" / "part").write_text("rank 0's part")
    output_folder.point(first / "best", first / "save-1")
    output_folder.point(first / "last", first / "save-1")

    output_folder.carry_best(first / "last", second, is_main=True)

    assert (second / "best").is_symlink() and (second / "best" / "part").read_text() == "rank 0's part"
    assert (second / "best").resolve().parent == second.resolve()
    output_folder.carry_best(first / "last", first, is_main=True)  # its own folder: nothing to do
    assert sorted(path.name for path in first.iterdir()) == ["best", "last", "save-1"]
