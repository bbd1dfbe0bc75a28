"""SIGTERM asks the run to stop at its next step; it no longer kills the process outright."""

import os
import signal

import pytest

from {{ cookiecutter.project_slug }} import errors, preemption
from {{ cookiecutter.project_slug }}.preemption import EpochProgress


class OneProcess:
    world_size = 1
    is_main = True
    local_rank = 0


@pytest.fixture
def restore_sigterm():
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_is_remembered_for_the_next_step_instead_of_killing_the_process(restore_sigterm):
    stop = preemption.StopRequest.on_sigterm()
    assert not stop.stop_now(OneProcess())

    os.kill(os.getpid(), signal.SIGTERM)

    assert stop.stop_now(OneProcess())


def test_leaving_after_a_stop_exits_with_the_status_of_a_terminated_process(tmp_path):
    with pytest.raises(SystemExit) as leaving:
        preemption.leave(preemption.Stopped(3, EpochProgress(step=7)), tmp_path / "last")

    assert leaving.value.code == 143


class TwoRanks:
    world_size = 2
    is_main = True
    local_rank = 0


@pytest.fixture
def ten_millisecond_steps(monkeypatch):
    """A clock that steps() moves 10 ms, and the times of the votes, with every rank voting alike."""
    clock = {"now": 0.0, "votes": []}
    monkeypatch.setattr(preemption.time, "perf_counter", lambda: clock["now"])

    def every_rank_alike(values, env):
        clock["votes"].append(clock["now"])
        return [value * env.world_size for value in values]

    monkeypatch.setattr(preemption.distributed, "all_reduce_sum", every_rank_alike)
    return clock


def test_ranks_vote_about_once_a_second_when_steps_are_short(ten_millisecond_steps):
    stop = preemption.StopRequest()
    for _ in range(1000):  # 10 s of training
        ten_millisecond_steps["now"] += 0.01
        assert not stop.stop_now(TwoRanks())

    assert 8 <= len(ten_millisecond_steps["votes"]) <= 12


def test_a_signal_stops_the_ranks_within_a_second(ten_millisecond_steps):
    stop = preemption.StopRequest()
    for _ in range(100):
        ten_millisecond_steps["now"] += 0.01
        stop.stop_now(TwoRanks())
    stop.signalled = True
    signalled_at = ten_millisecond_steps["now"]

    while not stop.stop_now(TwoRanks()):
        ten_millisecond_steps["now"] += 0.01

    assert ten_millisecond_steps["now"] - signalled_at <= 1.01


def test_a_loss_that_diverged_on_any_rank_stops_every_rank_at_the_next_vote(ten_millisecond_steps):
    stop = preemption.StopRequest()
    for step in range(1, 101):
        ten_millisecond_steps["now"] += 0.01
        stop.stop_now(TwoRanks(), loss_sum=2.5 * step, where=(2, step))
    votes = len(ten_millisecond_steps["votes"])

    with pytest.raises(preemption.Diverged) as diverged:
        for step in range(101, 300):
            ten_millisecond_steps["now"] += 0.01
            stop.stop_now(TwoRanks(), loss_sum=float("nan"), where=(2, step))

    assert len(ten_millisecond_steps["votes"]) == votes + 1  # the next vote, no collective more
    assert "epoch 2" in str(diverged.value) and "--lr" in str(diverged.value)


def test_a_diverged_loss_is_one_error_line_from_rank_0_and_status_1_on_every_rank(capsys):
    def diverge(shown):
        @errors.explain_user_errors
        def train(args):
            raise preemption.Diverged(3, 17, shown)

        with pytest.raises(SystemExit) as ending:
            train(None)
        return ending.value.code

    assert [diverge(shown=True), diverge(shown=False)] == [1, 1]
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: the training loss became NaN or infinite in epoch 3 by step 17")
