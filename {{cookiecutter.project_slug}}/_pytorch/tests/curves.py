"""Curves read back with TensorBoard's own reader, for test_tracking.py."""

from pathlib import Path

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

WRITER_MODULE = "torch.utils.tensorboard"  # what tracking.Tracker imports to write
CPU = torch.device("cpu")


def curve(output_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of each record of `tag`, values rounded to 6 digits; tracking.py keeps steps and epochs apart."""
    run = "steps" if tag.startswith("train/") else "epochs"
    events = EventAccumulator(str(Path(output_dir) / "tensorboard" / run))
    events.Reload()
    return [(event.step, round(event.value, 6)) for event in events.Scalars(tag)]
