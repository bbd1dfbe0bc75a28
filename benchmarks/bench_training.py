"""Training parity, start-up and memory: baked projects against the plain reference loops.

For each framework, one baked project per launcher and the reference (reference_<framework>.py,
started by the framework's own launcher) train the same model on the same sample data with the
same seed, batch and epochs, 2 processes on CPU. Runs are interleaved, repetition by repetition,
so that drifts of a noisy machine hit every configuration alike. Figures per configuration:
- epoch time (training and validation, as metrics.jsonl records it; epoch 1 left out as warm-up),
  as a ratio to the reference's in the same repetition;
- the largest relative difference of the per-epoch training loss to the reference's;
- peak resident memory of a rank, as a ratio to the reference's, and its growth over the run;
- start-up: seconds from starting the command to the end of the first training step, minus those
  of a reference run right beside it (one-epoch runs, the archive already extracted).
"""

import json
import shutil
import statistics
from pathlib import Path

from common import Watched, arguments, bake, extract_sample, summary, tool_env

HERE = Path(__file__).resolve().parent
CONFIGS = [  # (name, framework, answers); the reference of each framework comes first
    ("PyTorch reference (torchrun)", "pytorch", None),
    ("PyTorch torchrun", "pytorch", {"launcher": "torchrun"}),
    ("PyTorch launch", "pytorch", {"launcher": "launch"}),
    ("PyTorch spawn", "pytorch", {"launcher": "spawn"}),
    ("Paddle reference (launch)", "paddle", None),
    ("Paddle launch", "paddle", {"launcher": "launch"}),
    ("Paddle spawn", "paddle", {"launcher": "spawn"}),
    ("Paddle fleetrun", "paddle", {"launcher": "fleetrun"}),
    ("Paddle launch, high-level API", "paddle", {"launcher": "launch", "paddle_api": "highlevel"}),
]
ENV = {"NPROC_PER_NODE": "2", "OMP_NUM_THREADS": "1"}  # run.sh's share of 2 cores for 2 processes
STARTUP_PAIRS_PER_REPEAT = 2
FAILED_RUNS: list[str] = []  # runs that failed once (the plain torch reference sometimes aborts in gloo)


def reference_command(framework: str, args: list[str], log_dir: Path) -> list[str]:
    script = str(HERE / f"reference_{framework}.py")
    if framework == "pytorch":
        return ["torchrun", "--standalone", "--nproc-per-node", "2", script, *args]
    return [
        "python",
        "-m",
        "paddle.distributed.launch",
        "--nproc_per_node",
        "2",
        "--log_dir",
        str(log_dir),
        script,
        *args,
    ]


def run_config(
    project: Path, framework: str, answers, epochs: int, output: Path, log_every: int
) -> tuple[Watched, list]:
    """Train one configuration; returns the watched run (first_step_s: when its first step ended) and its epochs."""
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    if answers is None:
        first_step = (output / "first_step", "first step")
        args = ["--data-dir", "data/digits", "--epochs", str(epochs), "--first-step-file", str(first_step[0])]
        command, env = reference_command(framework, args, output), tool_env(PYTHONPATH=str(project), **ENV)
    else:
        first_step = (output / "train.log", "epoch 1 step 1/")
        command = [
            "bash",
            "run.sh",
            "--epochs",
            str(epochs),
            "--output-dir",
            str(output),
            "--log-every",
            str(log_every),
        ]
        env = tool_env(**ENV)
    try:
        watched = Watched(command, project, env, watch=first_step)
    except RuntimeError as failure:  # counted in the results, then tried once more
        FAILED_RUNS.append(str(failure).splitlines()[0])
        shutil.rmtree(output, ignore_errors=True)
        output.mkdir(parents=True)
        watched = Watched(command, project, env, watch=first_step)
    if answers is None:
        records = [json.loads(line) for line in watched.output.splitlines() if line.startswith('{"epoch"')]
    else:
        records = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    return watched, records


def main() -> dict:
    args = arguments(__doc__, epochs=20, repeats=3)
    return measure(args.work, args.epochs, args.repeats)


def measure(work: Path, epochs: int, repeats: int) -> dict:
    projects = {}
    for name, framework, answers in CONFIGS:
        projects[name] = bake(work / "projects" / str(len(projects)), framework=framework, **(answers or {}))
        extract_sample(projects[name])

    runs = {name: [] for name, _, _ in CONFIGS}
    for repeat in range(repeats):
        for name, framework, answers in CONFIGS:
            print(f"[training] repeat {repeat + 1}/{repeats}: {name}", flush=True)
            runs[name].append(run_config(projects[name], framework, answers, epochs, work / "runs" / name, 1000))
    # Start-up: one-epoch runs, each baked project right beside a run of its reference, in turn first. Twice the
    # repetitions: a start-up is a few seconds, and its noise only adds.
    starts = {name: [] for name, _, _ in CONFIGS}
    startup_extra = {name: [] for name, _, _ in CONFIGS}
    paired_reference = {name: [] for name, _, _ in CONFIGS}  # the reference's starts beside this configuration's
    pairs = STARTUP_PAIRS_PER_REPEAT * repeats
    for repeat in range(pairs):
        for name, framework, answers in CONFIGS:
            if answers is None:
                continue
            reference = next(n for n, f, a in CONFIGS if f == framework and a is None)
            pair = [(reference, None), (name, answers)]
            seen = {}
            for who, who_answers in pair if repeat % 2 else reversed(pair):
                print(f"[start-up] pair {repeat + 1}/{pairs}: {who}", flush=True)
                watched, _ = run_config(projects[who], framework, who_answers, 1, work / "runs" / who, log_every=1)
                seen[who] = watched.seen_at
                starts[who].append(watched.seen_at)
            startup_extra[name].append(seen[name] - seen[reference])
            paired_reference[name].append(seen[reference])

    results = {"failed_runs": FAILED_RUNS}
    for name, framework, answers in CONFIGS:
        reference = next(n for n, f, a in CONFIGS if f == framework and a is None)
        epoch_ratios, memory_ratios, growth, loss_diff = [], [], [], 0.0
        for (watched, records), (ref_watched, ref_records) in zip(runs[name], runs[reference], strict=True):
            epoch_ratios.append(median_epoch(records) / median_epoch(ref_records))
            memory_ratios.append(peak_rss(watched) / peak_rss(ref_watched))
            growth.append(rss_growth(watched))
            loss_diff = max(
                loss_diff,
                *(
                    abs(a["train_loss"] - b["train_loss"]) / abs(b["train_loss"])
                    for a, b in zip(records, ref_records, strict=True)
                ),
            )
        results[name] = {
            "framework": framework,
            "reference": answers is None,
            "epoch_s": summary([median_epoch(records) for _, records in runs[name]]),
            "epoch_ratio": summary(epoch_ratios),
            "loss_rel_diff": loss_diff,
            "epochs": len(runs[name][0][1]),
            "final_val_acc": runs[name][0][1][-1]["val_acc"],
            "peak_rss_mb": summary([peak_rss(w) / 1e6 for w, _ in runs[name]]),
            "rss_ratio": summary(memory_ratios),
            "rss_growth": summary(growth),
            "startup_s": summary(starts[name]),
            "startup_extra_s": summary(startup_extra[name] or [0.0]),
            # Against the fastest of the reference's runs beside it, as many as its own: the fastest of all the
            # reference's runs (several configurations' worth) would be a lower bar than any one configuration meets.
            "fastest_startup_extra_s": min(starts[name]) - min(paired_reference[name] or starts[name]),
            "run_s": summary([w.seconds for w, _ in runs[name]]),
        }
    return results


def median_epoch(records: list[dict]) -> float:
    return statistics.median(record["epoch_time_s"] for record in records[1:])


def rank_series(watched: Watched) -> list[list[int]]:
    """Memory samples of each rank: the processes that lived through most of the run. Not a short-lived one (a
    process caught while starting others, a helper that imports the framework for a second or two), whose
    growth over a few samples is its import, not a leak."""
    longest = max(len(samples) for samples in watched.rss.values())
    return [[rss for _, rss in samples] for samples in watched.rss.values() if len(samples) >= max(10, longest // 2)]


def peak_rss(watched: Watched) -> float:
    return max(max(values) for values in rank_series(watched))


def rss_growth(watched: Watched) -> float:
    """Per rank, the median memory of the run's last quarter over that of its second quarter; the largest."""
    ratios = []
    for values in rank_series(watched):
        quarter = len(values) // 4
        ratios.append(statistics.median(values[3 * quarter :]) / statistics.median(values[quarter : 2 * quarter]))
    return max(ratios)


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
