"""--ema's cost per optimizer step: a baked project's CPU loop of the sample model with and without the average.

    .venv/bin/python benchmarks/bench_ema.py [--epochs 40]

Per framework, one job of 2 processes (the framework's launcher runs this file with a project's folder): the
project's engine.train_one_epoch() trains the sample model without the average and with --ema's (engine.Ema,
started), taking turns epoch by epoch (A B, then B A) so that a noisy machine's drifts hit both alike; then
engine.Ema.update() alone is timed, many times. The cost per step is the update's median time against the median
step without it (the epoch's seconds over its optimizer steps); the paired epochs give the same share measured
whole, noisier. Rank 0 writes a JSON line.
"""

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import arguments, bake, epochs_in_turn, extract_sample, fmt, project_training, summary, tool_env

HERE = Path(__file__).resolve().parent
FRAMEWORKS = {"PyTorch (DDP)": "pytorch", "Paddle (DataParallel)": "paddle"}
DECAY = 0.999
UPDATES = 500  # timed calls of Ema.update() alone
BAR = 0.05  # of a step


def run_job(project: Path, framework: str, epochs: int, output: Path) -> dict:
    output.mkdir(parents=True, exist_ok=True)
    seconds_file = output / "seconds.json"
    args = [str(Path(__file__).resolve()), str(project), str(epochs), str(seconds_file)]
    if framework == "pytorch":
        command = ["torchrun", "--standalone", "--nproc-per-node", "2", *args]
    else:
        command = ["python", "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_level", "WARNING",
                   "--log_dir", str(output / "logs"), *args]  # fmt: skip
    subprocess.run(command, cwd=project, env=tool_env(OMP_NUM_THREADS="1"), check=True, capture_output=True)
    return json.loads(seconds_file.read_text())


def measure(work: Path, epochs: int) -> dict:
    results = {}
    for name, framework in FRAMEWORKS.items():
        print(f"[ema] {name}", flush=True)
        project = bake(work / "projects" / f"ema-{framework}", framework=framework)
        extract_sample(project)
        seconds = run_job(project, framework, epochs, work / "ema" / framework)
        averaged, plain = seconds["ema"][2:], seconds["plain"][2:]  # epochs 1 and 2 warm up
        step_s = statistics.median(plain) / seconds["steps"]
        results[name] = {
            "pairs": len(plain),
            "steps_per_epoch": seconds["steps"],
            "parameters": seconds["parameters"],
            "step_ms": 1000 * step_s,
            "update_ms": summary([1000 * s for s in seconds["update_s"]]),
            "update_share": statistics.median(seconds["update_s"]) / step_s,
            "epoch_ratio": summary([a / p for a, p in zip(averaged, plain, strict=True)]),
        }
    return results


def section(figures: dict) -> list[str]:
    """The section of RESULTS.md."""
    lines = [
        "## 10. Averaged weights (`bench_ema.py`)",
        "",
        f"`--ema {DECAY}`'s cost per optimizer step on the CPU loop of the sample model, 2 processes: the project's",
        "`engine.train_one_epoch()` without the average and with it, in turn epoch by epoch in one job;",
        f"`Ema.update()` alone timed {UPDATES} times. Its share of a step is its median time over the median step",
        "without it (bar < 5 %); the paired epochs measure the same whole, with the machine's noise.",
        "",
        "| loop | parameters | step ms | `Ema.update()` ms | its share of a step | epoch with / without, pairs |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in figures.items():
        share = f"{100 * f['update_share']:.2f} % " + ("meets the bar" if f["update_share"] < BAR else "**misses**")
        lines.append(
            f"| {name} | {f['parameters']:,} | {f['step_ms']:.2f} | {fmt(f['update_ms'])} | {share} "
            f"| {fmt(f['epoch_ratio'])} ({f['pairs']}) |"
        )
    return [*lines, ""]


def worker(project: str, epochs: int, seconds_file: str) -> None:
    """In each of the launcher's processes: the two loops in turn, then the update alone."""
    sys.path.insert(0, project)
    from dist_train import distributed, engine
    from dist_train.preemption import EpochProgress, StopRequest

    training = project_training(project)
    model, optimizer, loader = training.model, training.optimizer, training.train_loader
    ema = engine.Ema(model, DECAY)
    ema.start()

    def epoch(number: int, averaged: bool) -> None:
        engine.train_one_epoch(model, loader, optimizer, training.scaler, training.env, number, EpochProgress(),
                               StopRequest(), training.task, ema=ema if averaged else None)  # fmt: skip

    loops = {"ema": lambda number: epoch(number, True), "plain": lambda number: epoch(number, False)}
    seconds = {**epochs_in_turn(epochs, loops, distributed.barrier), "update_s": [], "steps": len(loader)}
    for _ in range(UPDATES):
        started = time.perf_counter()
        ema.update()
        seconds["update_s"].append(time.perf_counter() - started)
    seconds["parameters"] = engine.training_memory(model, optimizer)[0]
    if training.env.is_main:
        Path(seconds_file).write_text(json.dumps(seconds))
    distributed.cleanup()


def main() -> dict:
    args = arguments(__doc__, epochs=40)
    figures = measure(args.work, args.epochs)
    print("\n".join(section(figures)))
    return figures


if __name__ == "__main__":
    if len(sys.argv) == 4 and not sys.argv[1].startswith("-"):  # under the launcher: a project, epochs, a file
        worker(sys.argv[1], int(sys.argv[2]), sys.argv[3])
    else:
        main()
