"""A collective that timed out: the first rank to give up names, in one line, the ranks that never came."""

import threading
import time

import pytest

from {{ cookiecutter.project_slug }} import roll_call
from {{ cookiecutter.project_slug }}.errors import COLLECTIVE_TIMEOUT_STATUS, explain_user_errors

WHERE, LIMIT = "epoch 2 step 9/23", "--dist-timeout 5 s"
REMEDY = "raise --dist-timeout if a rank may rightly take longer"


class Store:
    """The rendezvous store's counters, which the ranks of a test (threads) share."""

    def __init__(self):
        self.counts, self.lock = {}, threading.Lock()

    def add(self, key: str, amount: int) -> int:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + amount
            return self.counts[key]


@pytest.fixture(autouse=True)
def short_waits(monkeypatch):
    monkeypatch.setattr(roll_call, "CHECK_IN_S", 0.3)
    monkeypatch.setattr(roll_call, "STORE_GRACE_S", 0.2)


def give_up(ranks: list[int], world_size: int, add) -> dict[int, roll_call.CollectiveTimedOut]:
    """The error of each of `ranks`, which give up in this order, 50 ms apart, at the same store."""
    errors = {}

    def one(rank: int) -> None:
        errors[rank] = roll_call.explained(WHERE, LIMIT, REMEDY, rank, world_size, add)

    threads = []
    for rank in ranks:
        threads.append(threading.Thread(target=one, args=(rank,)))
        threads[-1].start()
        time.sleep(0.05)
    for thread in threads:
        thread.join()
    return errors


def test_the_first_rank_to_give_up_names_the_ranks_that_never_came_and_the_others_end_quietly():
    errors = give_up([2, 0], world_size=4, add=Store().add)  # ranks 1 and 3 stopped answering

    assert errors[2].shown and not errors[0].shown
    assert str(errors[2]) == (
        "a collective timed out in epoch 2 step 9/23: ranks 1, 3 did not answer for --dist-timeout 5 s: check their "
        "machines and network (a process stopped, hung or out of memory, a machine down); raise --dist-timeout if a "
        "rank may rightly take longer"
    )
    assert {error.status for error in errors.values()} == {COLLECTIVE_TIMEOUT_STATUS}


def test_ranks_that_all_came_blame_the_network_between_them_and_do_not_wait_out_the_check_in():
    started = time.monotonic()

    errors = give_up([1, 0], world_size=2, add=Store().add)

    assert time.monotonic() - started < roll_call.CHECK_IN_S
    assert "every rank waited for another for --dist-timeout 5 s: check the network between the machines" in str(
        errors[1]
    )


@pytest.mark.parametrize("answer", ["hangs", "fails"])
def test_a_store_that_does_not_answer_either_is_said_and_the_rank_still_ends(answer):
    def add(key: str, amount: int) -> int:
        if answer == "fails":
            raise RuntimeError("Connection reset by peer")
        threading.Event().wait()  # its host is the rank that stopped
        return 0

    started = time.monotonic()

    [error] = give_up([1], world_size=2, add=add).values()

    assert time.monotonic() - started < roll_call.CHECK_IN_S + roll_call.STORE_GRACE_S + 0.5
    assert error.shown and "another rank did not answer, nor did the rendezvous store," in str(error)


def test_the_error_is_one_line_and_the_status_that_launchers_pass_on_without_a_line_of_their_own(capsys):
    @explain_user_errors
    def train(args):
        raise roll_call.CollectiveTimedOut("a collective timed out in epoch 2 step 9/23: ...")

    with pytest.raises(SystemExit) as exit_:
        train(None)

    assert exit_.value.code == COLLECTIVE_TIMEOUT_STATUS
    assert capsys.readouterr().err == "error: a collective timed out in epoch 2 step 9/23: ...\n"


@pytest.mark.parametrize(
    "framework, launcher, nodes, elastic",
    [
        ("pytorch", "torchrun", "multi", True),
        ("pytorch", "spawn", "multi", False),
        ("paddle", "fleetrun", "multi", True),
        ("pytorch", "torchrun", "single", False),
    ],
)
def test_a_lost_rank_offers_an_elastic_job_only_where_the_project_can_run_one(
    monkeypatch, framework, launcher, nodes, elastic
):
    monkeypatch.delenv(roll_call.JOB_ID_VARIABLE, raising=False)
    for name, value in {"FRAMEWORK": framework, "LAUNCHER": launcher, "NODES": nodes}.items():
        monkeypatch.setattr(roll_call.settings, name, value)

    line = str(roll_call.peer_gone(WHERE, shown=True))

    assert "run it again to resume from the last save" in line
    assert ("an elastic job, NNODES=MIN:MAX, goes on" in line) == elastic
