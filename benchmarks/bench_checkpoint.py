"""Checkpoint cost: what a save costs rank 0, and how long the other rank waits for it.

Two processes (torchrun, gloo, CPU) build a model of about 25 M parameters with an optimizer that
has state (SGD with momentum, after one step), and call the baked project's Checkpointer.end_epoch()
as run.py does at the end of an epoch, followed by the collective that starts the next epoch.
Rank 0 reports the seconds in save() and, of those, in writing the file (torch.save + fsync);
rank 1 reports the seconds from entering save() to the end of that collective: its wait.
"""

import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, sys.argv[1])  # a baked PyTorch project
from dist_train import checkpoint, distributed, engine  # noqa: E402
from dist_train.checkpoint import Checkpointer  # noqa: E402


def main(output: Path, repeats: int) -> None:
    env = distributed.setup("cpu", 600)
    model = distributed.wrap_model(nn.Sequential(nn.Linear(5000, 2500), nn.ReLU(), nn.Linear(2500, 5000)), env)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(4, 5000)).sum().backward()
    optimizer.step()
    schedule = engine.cosine_schedule(optimizer, epochs=1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    saver = Checkpointer(output, env, model, optimizer, schedule, scaler)

    writes = []
    original_save = checkpoint._atomic_save

    def timed_save(state, path):
        started = time.perf_counter()
        original_save(state, path)
        writes.append(time.perf_counter() - started)

    checkpoint._atomic_save = timed_save
    in_save, waits = [], []
    for epoch in range(1, repeats + 1):
        distributed.barrier()
        started = time.perf_counter()
        saver.end_epoch(epoch, 0.0)  # never the best: one file written, as in most epochs
        in_save.append(time.perf_counter() - started)
        distributed.all_reduce_sum([1.0], env)  # the next epoch's first collective
        waits.append(time.perf_counter() - started)
    report = {"rank": env.rank, "in_save_s": in_save, "until_next_collective_s": waits, "write_s": writes}
    gathered = distributed.all_gather_object(report)
    if env.is_main:
        parameters = sum(p.numel() for p in model.parameters())
        print(json.dumps({"parameters": parameters, "bytes": saver.last_path.stat().st_size, "ranks": gathered}))
    distributed.cleanup()


if __name__ == "__main__":
    main(Path(sys.argv[2]), int(sys.argv[3]))
