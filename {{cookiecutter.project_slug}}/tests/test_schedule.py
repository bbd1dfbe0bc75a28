"""The learning rate's schedule: a rise from 0 over --warmup-epochs, then the cosine; a closed form of where training
stands, in epochs."""

import math

import pytest

from {{ cookiecutter.project_slug }}.state import Schedule


def factors(schedule: Schedule, positions: list[float]) -> list[float]:
    rates = []
    for position in positions:
        schedule.position = position
        rates.append(schedule.factor())
    return rates


def test_the_rate_rises_from_zero_over_the_warmup_then_follows_the_cosine_to_zero():
    schedule = Schedule(epochs=5, warmup=1.5)

    rates = factors(schedule, [0, 0.75, 1.5, 3.25, 5])

    assert rates == pytest.approx([0, 0.5, 1, 0.5, 0])


def test_without_a_warmup_each_epoch_starts_at_the_rate_of_the_first_versions_per_epoch_schedule():
    rates = factors(Schedule(epochs=4), [0, 1, 2, 3])

    assert rates == pytest.approx([0.5 * (1 + math.cos(math.pi * epoch / 4)) for epoch in range(4)])


def test_the_rate_changes_within_an_epoch_and_a_longer_run_follows_its_own_horizon():
    assert factors(Schedule(epochs=2), [0.5]) == pytest.approx([0.5 * (1 + math.cos(math.pi / 4))])
    assert factors(Schedule(epochs=4), [2]) == pytest.approx([0.5])  # resumed at epoch 2 with --epochs 4


def test_a_warmup_as_long_as_the_run_only_rises():
    assert factors(Schedule(epochs=2, warmup=2), [0, 1, 2]) == pytest.approx([0, 0.5, 1])
