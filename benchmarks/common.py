"""What every benchmark needs: baking, running a command while watching it, and robust summaries."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

TEMPLATE = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool_env(**extra: str) -> dict:
    """The environment of a user who activated the template's .venv."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    return env | extra


def bake(output: Path, **answers: str) -> Path:
    """A fresh project in `output`, which is emptied first."""
    from cookiecutter.main import cookiecutter

    shutil.rmtree(output, ignore_errors=True)
    return Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(output), extra_context=answers))


def arguments(description: str, **numbers: int) -> argparse.Namespace:
    """A benchmark's command line: --work (its folder, build/bench by default) and an integer option per keyword,
    whose value is the option's default: `arguments(__doc__, repeats=3)` reads --work and --repeats."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--work", type=Path, default=Path("build/bench"))
    for name, default in numbers.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    return parser.parse_args()


def reference_arguments() -> argparse.Namespace:
    """reference_<framework>.py's command line: the baked project's data, the epochs, batch, rate and seed it trains
    with, and the file rank 0 marks its first step in (bench_training.py times the start-up by it)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first-step-file", help="rank 0 writes a line here after its first step")
    return parser.parse_args()


def reference_epochs(args: argparse.Namespace, rank: int, epoch_totals, schedule) -> None:
    """The reference's epochs: epoch_totals(epoch, after_step) trains and validates one (plain_epoch()'s totals of
    all ranks), the schedule steps after it, and rank 0 prints its JSON line."""

    def after_step() -> None:
        if rank == 0 and args.first_step_file:
            with open(args.first_step_file, "w") as file:
                file.write("first step\n")
            args.first_step_file = None

    for epoch in range(1, args.epochs + 1):
        started = time.perf_counter()
        totals = epoch_totals(epoch, after_step)
        schedule.step()
        if rank == 0:
            record = {"epoch": epoch, "train_loss": totals[0] / totals[1], "val_acc": totals[2] / totals[3]}
            print(json.dumps(record | {"epoch_time_s": time.perf_counter() - started}), flush=True)


def project_training(project: str) -> SimpleNamespace:
    """In one of a launcher's processes (the project's folder on sys.path): the project's training on its extracted
    sample as run.py sets it up on CPUs, in full precision. Its args, env (the process group joined), task, data
    (train_set, val_set), train_loader, val_loader, model (wrapped), optimizer and scaler."""
    from dist_train import cli, distributed, engine, loaders, seam

    args = cli.parse_args(["--device", "cpu", "--data-dir", f"{project}/data/digits"])
    env = distributed.setup("cpu", 600)
    task = seam.Task()
    train_set, val_set, outputs = task.datasets(args)
    train_loader, val_loader = loaders.build_loaders(train_set, val_set, args.batch_size, 0, args.seed, env)
    model = distributed.wrap_model(task.network(seam.data_description(train_set, outputs)), env)
    scaler = engine.grad_scaler(None)  # full precision, as on CPUs
    model, optimizer, scaler = distributed.wrap_optimizer(model, task.optimizer(model, cli.DEFAULT_LR), scaler)
    return SimpleNamespace(
        args=args, env=env, task=task, train_set=train_set, val_set=val_set, train_loader=train_loader,
        val_loader=val_loader, model=model, optimizer=optimizer, scaler=scaler,
    )  # fmt: skip


def epochs_in_turn(epochs: int, loops: dict, barrier) -> dict[str, list[float]]:
    """Each of `loops`' seconds per epoch: loops[name](epoch) runs one epoch, the loops taking turns epoch by epoch
    (A B, then B A) so that a noisy machine's drifts hit them alike; barrier() lines the ranks up before each."""
    seconds = {name: [] for name in loops}
    order = list(loops.items())
    for epoch in range(1, epochs + 1):
        for name, run_epoch in order if epoch % 2 else reversed(order):
            barrier()
            started = time.perf_counter()
            run_epoch(epoch)
            seconds[name].append(time.perf_counter() - started)
    return seconds


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(stats: dict, digits: int = 3) -> str:
    return f"{stats['median']:.{digits}f} [{stats['min']:.{digits}f}, {stats['max']:.{digits}f}]"


def extract_sample(project: Path) -> None:
    """Extract a baked project's sample archive once, with the project's own code, as its first run would."""
    extract = "from dist_train.archive import ensure_extracted as e; e('data/digits.zip', 'data/digits')"
    subprocess.run(["python", "-c", extract], cwd=project, env=tool_env(), check=True, capture_output=True)


class Watched:
    """A command run to its end: its output, every rank's memory over time, and when a file first held a text.

    Ranks are the command's processes that start no others and hold over 150 MB (the launchers
    and spawn's helpers either have children or stay small).
    """

    def __init__(self, command: list[str], cwd: Path, env: dict, watch: tuple[Path, str] | None = None):
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.rss: dict[int, list[tuple[float, int]]] = {}
        self.seen_at: float | None = None
        threads = [threading.Thread(target=self._sample_memory, daemon=True)]
        if watch:
            threads.append(threading.Thread(target=self._watch, args=watch, daemon=True))
        for thread in threads:
            thread.start()
        self.output = self.process.stdout.read()
        self.returncode = self.process.wait()
        self.seconds = time.monotonic() - self.started
        for thread in threads:
            thread.join()
        if self.returncode != 0:
            tail = "\n".join(self.output.splitlines()[-30:])
            raise RuntimeError(f"{' '.join(command)} failed with status {self.returncode}:\n{tail}")

    def _sample_memory(self) -> None:
        while self.process.poll() is None:
            now = time.monotonic() - self.started
            for pid in descendants(self.process.pid):
                rss = resident_bytes(pid)
                if rss > 150e6 and not children(pid):
                    self.rss.setdefault(pid, []).append((now, rss))
            time.sleep(0.1)

    def _watch(self, path: Path, text: str) -> None:
        while self.process.poll() is None:
            try:
                if text in path.read_text():
                    self.seen_at = time.monotonic() - self.started
                    return
            except OSError:  # not written yet
                pass
            time.sleep(0.005)


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    found, todo = [], children(pid)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children(pid))
    return found


def resident_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
