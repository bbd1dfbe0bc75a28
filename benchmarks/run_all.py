"""Run every benchmark and write benchmarks/RESULTS.md and benchmarks/parity.png.

    make bench        (or: .venv/bin/python benchmarks/run_all.py [--quick] [--no-suite])

Every figure is a ratio against a plain reference measured in the same run, over several
repetitions: median [min, max].
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import bench_archive
import bench_bake
import bench_ema
import bench_gpu
import bench_loop
import bench_predict
import bench_scale
import bench_training
from common import TEMPLATE, bake, fmt, summary, tool_env

HERE = Path(__file__).resolve().parent


def checkpoint_cost(work: Path, repeats: int) -> dict:
    project = bake(work / "projects" / "checkpoint", framework="pytorch")
    command = ["torchrun", "--standalone", "--nproc-per-node", "2", str(HERE / "bench_checkpoint.py"),
               str(project), str(work / "checkpoint"), str(repeats)]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=tool_env(OMP_NUM_THREADS="1"), check=True)
    raw = json.loads(result.stdout.strip().splitlines()[-1])
    rank0, rank1 = raw["ranks"]
    return {
        "parameters": raw["parameters"],
        "file_mb": raw["bytes"] / 1e6,
        "rank0_in_save_s": summary(rank0["in_save_s"]),
        "rank0_write_s": summary(rank0["write_s"]),
        "rank1_wait_s": summary(rank1["until_next_collective_s"]),
        "rank1_in_save_s": summary(rank1["in_save_s"]),
        "saves": repeats,
    }


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    memory_kb = int(Path("/proc/meminfo").read_text().split()[1])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=TEMPLATE, capture_output=True, text=True)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_kb / 2**20,
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: version(name) for name in ("torch", "paddlepaddle", "cookiecutter", "numpy")},
        "commit": commit.stdout.strip() or "unknown",
    }


def mark(ok: bool) -> str:
    return "meets the bar" if ok else "**misses the bar**"


def error_bars(figures: list[dict]) -> tuple[list[float], list[list[float]]]:
    medians = [f["median"] for f in figures]
    return medians, [[m - f["min"] for m, f in zip(medians, figures, strict=True)],
                     [f["max"] - m for m, f in zip(medians, figures, strict=True)]]  # fmt: skip


def write_chart(loop: dict, training: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [name for name, figures in training.items() if not figures["reference"]]
    panels = [
        (
            "loop parity, interleaved epochs:\nbaked / plain epoch time",
            list(loop),
            [f["ratio"] for f in loop.values()],
            1.03,
        ),
        (
            "whole runs: baked / reference\nepoch time (drifts between runs)",
            runs,
            [training[n]["epoch_ratio"] for n in runs],
            1.03,
        ),
        ("whole runs: baked / reference\npeak memory per rank", runs, [training[n]["rss_ratio"] for n in runs], 1.1),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), gridspec_kw={"width_ratios": [1, 1, 1]})
    for axis, (title, names, figures, bar) in zip(axes, panels, strict=True):
        medians, errors = error_bars(figures)
        axis.barh(names, medians, xerr=errors, color="#4c72b0", capsize=3)
        axis.axvline(1.0, color="black", linewidth=0.8)
        axis.axvline(bar, color="#c44e52", linestyle="--", label=f"bar {bar}")
        axis.set_xlim(0.7, max(bar, *(f["max"] for f in figures)) + 0.05)
        axis.set_title(title, fontsize=10)
        axis.invert_yaxis()
        axis.tick_params(axis="y", labelsize=8)
        axis.legend(loc="lower right", fontsize=8)
    fig.suptitle("Baked projects against plain loops: 2 processes, CPU (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(
    path: Path, info: dict, loop: dict, training: dict, archive: dict, baking: dict, checkpoint: dict, predict: dict,
    scale: dict, ema: dict, gpu: dict | None, args, failed_runs: list[str],
) -> None:  # fmt: skip
    references = [f for f in training.values() if f["reference"]]
    drift = max(f["epoch_s"]["max"] / f["epoch_s"]["min"] for f in references)
    lines = [
        "# Benchmark results",
        "",
        f"Written by `make bench` (`benchmarks/run_all.py`) on {info['date']}, commit {info['commit']}.",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']:.0f} GiB; {info['os']}.",
        f"Python {info['python']}; " + ", ".join(f"{name} {v}" for name, v in info["versions"].items()) + ".",
        "",
        "Each figure is median [min, max] over repetitions; every ratio is against a plain reference measured in",
        "the same run. Sections 1 to 6, 8 and 9 ran on this machine's CPUs; section 7 comes from `bench_gpu.py`, run",
        "where a GPU is.",
        "",
        "## 1. Training parity (2 processes, CPU)",
        "",
        "**Epoch time, interleaved** (`bench_loop.py`, the figure the bar is judged on): in one job of 2 processes,",
        "the baked project's `engine.train_one_epoch()` + `engine.evaluate()` and a plain tutorial loop",
        "(`plain_epoch()` of `reference_pytorch.py`, `reference_paddle.py`, run beside the project's loop by `loop_parity.py`: DistributedSampler / DistributedBatchSampler, SGD / Momentum, a",
        "validation pass) take turns epoch by epoch on the same wrapped model and sample data (digits, batch 32",
        "per process). Each pair of neighbouring epochs gives one ratio.",
        "",
        "| loop (wrappers; launchers) | pairs | baked epoch s | plain epoch s | baked / plain (bar <= 1.03) |",
        "|---|---|---|---|---|",
    ]
    for name, f in loop.items():
        lines.append(
            f"| {name} | {f['pairs']} | {fmt(f['baked_epoch_s'])} | {fmt(f['plain_epoch_s'])} "
            f"| {fmt(f['ratio'])} {mark(f['ratio']['median'] <= 1.03)} |"
        )
    lines += [
        "",
        f"**Whole runs** (`bench_training.py`): each launcher's baked project (`bash run.sh`, {args.epochs} epochs) against",
        "`reference_pytorch.py` under torchrun and `reference_paddle.py` under paddle launch: the project's",
        "`build_model` and `build_datasets` in a tutorial loop, same seed, batch 32 per process, a cosine learning",
        f"rate per epoch; {args.repeats} repetitions, runs interleaved. Epoch time is training plus validation as",
        "`metrics.jsonl` records it, the median over epochs 2 and later. These runs are minutes apart, and this",
        f"machine's speed drifts by more than the bar between them: the reference's own runs differ by up to {drift:.2f}x.",
        "So their epoch ratio is shown for completeness, and the bar is judged on the interleaved figure above.",
        f"Runs that failed and were run again: {len(failed_runs)}"
        + "".join(f"; `{line}`" for line in failed_runs)
        + ".",
        "",
        "| configuration | epoch s | epoch time / reference | train loss: max relative difference per epoch (bar <= 1e-5) | final val_acc |",
        "|---|---|---|---|---|",
    ]
    for name, f in training.items():
        ratio = "1" if f["reference"] else fmt(f["epoch_ratio"])
        loss = "0" if f["reference"] else f"{f['loss_rel_diff']:.1e} {mark(f['loss_rel_diff'] <= 1e-5)}"
        lines.append(f"| {name} | {fmt(f['epoch_s'])} | {ratio} | {loss} | {f['final_val_acc']:.4f} |")
    lines += [
        "",
        "![parity chart](parity.png)",
        "",
        "## 2. Start-up",
        "",
        "Seconds from starting the command (`bash run.sh` for a baked project, the launcher for a reference) to",
        "the end of the first training step, the archive already extracted; 2 processes, one-epoch runs. Each",
        f"baked run has a reference run right beside it (in turn first); {bench_training.STARTUP_PAIRS_PER_REPEAT * args.repeats} such pairs.",
        "",
        "Start-up only gains noise, never loses it: Paddle's ranks sometimes find the rendezvous store not yet",
        "listening and retry 3 s later, in the reference as in a baked project. So the bar is judged on the",
        "fastest start of each against the fastest of the reference runs beside it, as many as its own (the last",
        "column); the paired differences are shown beside it.",
        "",
        "| configuration | start-up s | baked - reference, paired s | fastest baked - fastest reference s (bar <= 0.3) |",
        "|---|---|---|---|",
    ]
    for name, f in training.items():
        if f["reference"]:
            lines.append(f"| {name} | {fmt(f['startup_s'], 2)} | 0 | 0 |")
            continue
        fastest = f["fastest_startup_extra_s"]
        lines.append(
            f"| {name} | {fmt(f['startup_s'], 2)} | {fmt(f['startup_extra_s'], 2)} | {fastest:.2f} {mark(fastest <= 0.3)} |"
        )
    lines += [
        "",
        "## 4. Memory",
        "",
        f"Resident memory of each rank, sampled every 0.1 s during the {args.epochs}-epoch whole runs. Growth is the",
        "median of a rank's last quarter of samples over that of its second quarter (1.00 is flat).",
        "",
        "| configuration | peak RSS per rank, MB | baked / reference (bar <= 1.1) | growth |",
        "|---|---|---|---|",
    ]
    for name, f in training.items():
        ratio = "1" if f["reference"] else f"{fmt(f['rss_ratio'])} {mark(f['rss_ratio']['median'] <= 1.1)}"
        lines.append(f"| {name} | {fmt(f['peak_rss_mb'], 0)} | {ratio} | {fmt(f['rss_growth'])} |")
    ratio = archive["throughput_vs_unzip"]
    lines += [
        "",
        "## 3. Archive extraction",
        "",
        f"A generated zip of {archive['files']:,} files of random bytes (incompressible, like images),"
        f" {archive['archive_mb']:.0f} MB; {args.repeats} repetitions into fresh folders, a different tool first each time.",
        "",
        "| tool | seconds | throughput / unzip |",
        "|---|---|---|",
        f"| `unzip -q` | {fmt(archive['seconds']['unzip'], 2)} | 1 |",
        f"| `zipfile.ZipFile.extractall` | {fmt(archive['seconds']['extractall'], 2)} | {fmt(ratio['extractall'], 2)} |",
        f"| baked `archive.ensure_extracted` (checks, lock, staging, marker) | {fmt(archive['seconds']['baked'], 2)} "
        f"| {fmt(ratio['baked'], 2)} {mark(ratio['baked']['median'] >= 0.8)} (bar >= 0.8) |",
        "",
        f"Second start, the folder already extracted: {fmt(archive['second_start_s'], 4)} s in `ensure_extracted` "
        f"{mark(archive['second_start_s']['max'] < 0.1)} (bar < 0.1 s).",
        "",
        "## 5. Baking and testing",
        "",
        f"{baking['combinations']} accepted combinations of answers, each baked 3 times in-process into fresh folders"
        f" (per combination the median): {fmt(baking['bake_s'])} s; slowest {baking['slowest']}.",
        "",
        "| combinations | bake s (bar < 1 s) |",
        "|---|---|",
        f"| `dataset=zip` and `synthetic` | {fmt(baking['other_bake_s'])} {mark(baking['other_bake_s']['max'] < 1)} |",
        f"| `dataset=folder` (the hook unpacks the 1,797 sample images) | {fmt(baking['folder_bake_s'])} "
        f"{mark(baking['folder_bake_s']['max'] < 1)} |",
        "",
        f"Writing those 1,797 files alone (`zipfile.extractall` of the sample archive) takes {fmt(baking['sample_unpack_s'])} s"
        " on this machine's disk: what a `dataset=folder` bake costs beyond the others is that write.",
        f"The `cookiecutter --no-input` command for the default project, process start included: {baking['command_bake_s']:.2f} s.",
        "",
    ]
    if "suite_s" in baking:
        ok = baking["suite_s"] < 28 * 60 and baking["suite_status"] == 0  # CI has 30 minutes, its set-up included
        lines.append(
            f"The whole test command (`make test`, this machine): {baking['suite_s'] / 60:.1f} min, "
            f"`{baking['suite_summary']}` (status {baking['suite_status']}) {mark(ok)} (bar: under 28 min, CI's 30 less its set-up)."
        )
    lines += [
        "",
        "## 6. Checkpoint cost",
        "",
        f"A model of {checkpoint['parameters'] / 1e6:.1f} M parameters with SGD momentum state, 2 processes (torchrun, gloo),"
        f" a {checkpoint['file_mb']:.0f} MB `last.pt`; {checkpoint['saves']} saves.",
        "",
        f"- rank 0 in `save()`: {fmt(checkpoint['rank0_in_save_s'])} s, of which writing the file (`torch.save`, fsync, rename): "
        f"{fmt(checkpoint['rank0_write_s'])} s",
        f"- rank 1 in `save()`: {fmt(checkpoint['rank1_in_save_s'])} s; from entering `save()` to the end of the next epoch's "
        f"first collective: {fmt(checkpoint['rank1_wait_s'])} s",
        "",
        "Rank 1 gathers the RNG states with rank 0, returns, and waits at the next collective while rank 0 writes:",
        f"its wait exceeds the write by {1000 * (checkpoint['rank1_wait_s']['median'] - checkpoint['rank0_write_s']['median']):.0f} ms"
        " (median), the gather and the collective themselves.",
        "",
        *bench_gpu.section(gpu, bench_gpu.NOTES.read_text() if bench_gpu.NOTES.exists() else ""),
        *bench_predict.section(predict),
        *bench_scale.section(scale),
        *bench_ema.section(ema),
    ]
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=TEMPLATE / "build" / "bench")
    parser.add_argument("--quick", action="store_true", help="fewer epochs and repetitions, to try the scripts")
    parser.add_argument(
        "--suite", action=argparse.BooleanOptionalAction, default=True, help="time the test command too"
    )
    parser.add_argument("--reuse", action="store_true", help="keep the stages an interrupted run finished")
    args = parser.parse_args()
    args.epochs, args.repeats = (3, 1) if args.quick else (20, 3)

    info = machine()

    def stage(name: str, measure):
        """A stage's figures, kept in the work folder: --reuse takes them from an interrupted run."""
        saved = args.work / "stages" / f"{name}.json"
        if args.reuse and saved.exists():
            return json.loads(saved.read_text())
        figures = measure()
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(figures))
        return figures

    loop = stage("loop", lambda: bench_loop.measure(args.work, 20 if args.quick else 100))
    training = stage("training", lambda: bench_training.measure(args.work, args.epochs, args.repeats))
    archive = stage("archive", lambda: bench_archive.measure(args.work, args.repeats))
    checkpoint = stage("checkpoint", lambda: checkpoint_cost(args.work, max(args.repeats, 3)))
    baking = stage("baking", lambda: bench_bake.measure(args.work, args.suite))
    predict = stage(
        "predict", lambda: bench_predict.measure(args.work, args.repeats, 10_000 if args.quick else 100_000)
    )
    scale = stage("scale", lambda: bench_scale.measure(args.work, max(args.repeats, 5)))
    ema = stage("ema", lambda: bench_ema.measure(args.work, 10 if args.quick else 40))
    raw = {
        "machine": info,
        "loop": loop,
        "training": training,
        "archive": archive,
        "baking": baking,
        "checkpoint": checkpoint,
        "predict": predict,
        "scale": scale,
        "ema": ema,
    }
    (HERE / "results.json").write_text(json.dumps(raw, indent=2))
    failed_runs = training.pop("failed_runs")
    write_chart(loop, training, HERE / "parity.png")
    gpu_results = HERE / "results-gpu.json"  # bench_gpu.py's, from a GPU machine: no GPU runs here
    gpu = json.loads(gpu_results.read_text()) if gpu_results.exists() else None
    write_results(
        HERE / "RESULTS.md", info, loop, training, archive, baking, checkpoint, predict, scale, ema, gpu, args,
        failed_runs,
    )  # fmt: skip
    print(f"wrote {HERE / 'RESULTS.md'} and {HERE / 'parity.png'}")


if __name__ == "__main__":
    sys.exit(main())
