"""How long training waits for its batches: data_wait in every metrics.jsonl row, and one hint when more
loader workers would help.

The wait is the host's time inside the loader's next(), read from the clock with no device synchronisation:
a GPU step that is still running does not count as waiting for data. Whether the loader computes or waits on
storage is told by the CPU time of the loop's own thread during the wait (where PyTorch loads with --workers 0;
the framework's other threads may spin meanwhile; paddle reads in a thread of its own, so there a slow loader
with --workers 0 counts as waiting on storage).
"""

import logging
import time

from . import hardware

log = logging.getLogger(__name__)

CHECK_AFTER_STEPS = 20  # the first steps of a run include the workers' start


class LoaderWatch:
    def __init__(self, workers: int, loader_cores: int, is_main: bool):
        """`loader_cores`: the cores this process's loader workers may use (hardware.loader_cores())."""
        self.workers, self.loader_cores, self.is_main = workers, loader_cores, is_main
        self.checked = False
        self.start_epoch()

    @classmethod
    def of(cls, loader, env) -> "LoaderWatch":
        """The watch of a training loader of this process (a distributed.DistEnv)."""
        cores = hardware.loader_cores(env.on_gpu, env.local_world_size, hardware.usable_cores())
        return cls(loader.num_workers, cores, env.is_main)

    def start_epoch(self) -> None:
        self.started, self.wait, self.wait_cpu, self.steps = time.perf_counter(), 0.0, 0.0, 0

    def batches(self, loader):
        """The loader's batches, each wait for one timed."""
        self.start_epoch()
        batches = iter(loader)
        while True:
            asked, asked_cpu = time.perf_counter(), time.thread_time()
            try:
                batch = next(batches)
            except StopIteration:
                return
            self.waited(time.perf_counter() - asked, time.thread_time() - asked_cpu)
            yield batch

    def waited(self, seconds: float, cpu_seconds: float) -> None:
        """One batch came after `seconds` (of which the loop's thread computed `cpu_seconds`)."""
        self.wait += seconds
        self.wait_cpu += cpu_seconds
        self.steps += 1
        if self.steps == CHECK_AFTER_STEPS and not self.checked:
            self.checked = True
            hint = self.hint()
            if hint and self.is_main:
                log.warning(hint)

    @property
    def data_wait(self) -> float:
        """The part of the epoch's training time so far spent waiting for batches."""
        return self.wait / max(time.perf_counter() - self.started, 1e-9)

    def hint(self) -> str | None:
        """What to change when the loop waits on its loader more than on its model and more workers can help:
        there are cores to spare, or the loader waits on storage (it computes less than half the time it takes)."""
        if self.data_wait <= 0.5:
            return None
        on_storage = self.workers == 0 and self.wait_cpu < 0.5 * self.wait
        if on_storage:
            more, why = 4, "it waits on storage more than it computes"
        elif self.loader_cores > self.workers:
            more, why = self.loader_cores, f"{self.loader_cores} cores are free for them"
        else:
            return None
        return (
            f"training waits for its data {100 * self.data_wait:.0f} % of the time with --workers {self.workers} "
            f"({why}): try --workers {more}"
        )
