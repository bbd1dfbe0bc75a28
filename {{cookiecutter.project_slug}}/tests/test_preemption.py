"""SIGTERM asks the run to stop at its next step; it no longer kills the process outright."""

import os
import signal

import pytest

from {{ cookiecutter.project_slug }} import preemption


class OneProcess:
    world_size = 1


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
        preemption.leave(3, preemption.EpochProgress(step=7), tmp_path / "last")

    assert leaving.value.code == 143
