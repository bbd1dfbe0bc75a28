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
import bench_training
from common import TEMPLATE, bake, fmt, summary, tool_env

HERE = Path(__file__).resolve().parent
BARS = {"epoch_ratio": 1.03, "loss_rel_diff": 1e-5, "startup_extra_s": 0.3, "rss_ratio": 1.1, "unzip_ratio": 0.8}


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


def write_chart(training: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name, figures in training.items() if not figures["reference"]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, key, bar, title in (
        (axes[0], "epoch_ratio", BARS["epoch_ratio"], "epoch time / reference"),
        (axes[1], "rss_ratio", BARS["rss_ratio"], "peak memory per rank / reference"),
    ):
        medians = [training[name][key]["median"] for name in names]
        low = [m - training[name][key]["min"] for m, name in zip(medians, names, strict=True)]
        high = [training[name][key]["max"] - m for m, name in zip(medians, names, strict=True)]
        axis.barh(names, medians, xerr=[low, high], color="#4c72b0", capsize=3)
        axis.axvline(1.0, color="black", linewidth=0.8)
        axis.axvline(bar, color="#c44e52", linestyle="--", label=f"bar {bar}")
        axis.set_xlim(0.8, max(bar, *(training[name][key]["max"] for name in names)) + 0.05)
        axis.set_title(title)
        axis.invert_yaxis()
        axis.legend(loc="lower right")
    axes[1].set_yticklabels([])
    fig.suptitle("Baked projects against a plain loop: 2 processes, CPU (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_results(path: Path, info: dict, training: dict, archive: dict, baking: dict, checkpoint: dict, args) -> None:
    lines = [
        "# Benchmark results",
        "",
        f"Written by `make bench` (`benchmarks/run_all.py`) on {info['date']}, commit {info['commit']}.",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['memory_gib']:.0f} GiB, no GPU; {info['os']}.",
        f"Python {info['python']}; " + ", ".join(f"{name} {v}" for name, v in info["versions"].items()) + ".",
        "",
        "Each figure is median [min, max] over repetitions; ratios are against a plain reference measured in",
        "the same run, interleaved with it. A GPU section is missing: no GPU was available to this run.",
        "",
        "## 1, 2, 4. Training parity, start-up and memory (2 processes, CPU)",
        "",
        "The default project's model and sample data (digits, 1,437 training images), batch 32 per process,",
        f"{args.epochs} epochs, {args.repeats} repetitions. The references are `benchmarks/reference_pytorch.py` (torchrun)",
        "and `benchmarks/reference_paddle.py` (paddle launch): a tutorial loop with the project's `build_model` and",
        "`build_datasets`, nothing else of it. Epoch time is training plus validation, epoch 1 left out.",
        "",
        "| configuration | epoch s | epoch time / reference (bar <= 1.03) | train loss, max rel. diff (bar <= 1e-5) |"
        " start-up s | start-up - reference s (bar <= 0.3) | peak RSS MB | RSS / reference (bar <= 1.1) | RSS growth, last/second quarter |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, f in training.items():
        if f["reference"]:
            lines.append(
                f"| {name} | {fmt(f['epoch_s'])} | 1 | 0 | {fmt(f['startup_s'], 2)} | 0 | {fmt(f['peak_rss_mb'], 0)} | 1 "
                f"| {fmt(f['rss_growth'])} |"
            )
            continue
        lines.append(
            f"| {name} | {fmt(f['epoch_s'])} | {fmt(f['epoch_ratio'])} {mark(f['epoch_ratio']['median'] <= BARS['epoch_ratio'])} "
            f"| {f['loss_rel_diff']:.1e} {mark(f['loss_rel_diff'] <= BARS['loss_rel_diff'])} | {fmt(f['startup_s'], 2)} "
            f"| {fmt(f['startup_extra_s'], 2)} {mark(f['startup_extra_s']['median'] <= BARS['startup_extra_s'])} "
            f"| {fmt(f['peak_rss_mb'], 0)} | {fmt(f['rss_ratio'])} {mark(f['rss_ratio']['median'] <= BARS['rss_ratio'])} "
            f"| {fmt(f['rss_growth'])} |"
        )
    lines += ["", "![parity chart](parity.png)", ""]
    ratio = archive["throughput_vs_unzip"]
    lines += [
        "## 3. Archive extraction",
        "",
        f"A generated zip of {archive['files']:,} files of random bytes (incompressible, like images),"
        f" {archive['archive_mb']:.0f} MB; {args.repeats} repetitions into fresh folders.",
        "",
        "| tool | seconds | throughput / unzip |",
        "|---|---|---|",
        f"| `unzip -q` | {fmt(archive['seconds']['unzip'], 2)} | 1 |",
        f"| `zipfile.ZipFile.extractall` | {fmt(archive['seconds']['extractall'], 2)} | {fmt(ratio['extractall'], 2)} |",
        f"| baked `archive.ensure_extracted` (checks, lock, staging, marker) | {fmt(archive['seconds']['baked'], 2)} "
        f"| {fmt(ratio['baked'], 2)} {mark(ratio['baked']['median'] >= BARS['unzip_ratio'])} (bar >= 0.8) |",
        "",
        f"Second start, the folder already extracted: {fmt(archive['second_start_s'], 4)} s in `ensure_extracted` "
        f"{mark(archive['second_start_s']['max'] < 0.1)} (bar < 0.1 s).",
        "",
        "## 5. Baking and testing",
        "",
        f"{baking['combinations']} accepted combinations of answers, each baked once in-process: "
        f"{fmt(baking['bake_s'])} s (slowest: {baking['slowest']}) {mark(baking['bake_s']['max'] < 1)} (bar < 1 s).",
        f"The `cookiecutter --no-input` command for the default project, process start included: {baking['command_bake_s']:.2f} s.",
    ]
    if "suite_s" in baking:
        lines.append(
            f"The whole test command (`make test`, this machine): {baking['suite_s'] / 60:.1f} min, "
            f"`{baking['suite_summary']}` (status {baking['suite_status']}) {mark(baking['suite_s'] < 20 * 60 and baking['suite_status'] == 0)} (bar: well under 20 min)."
        )
    lines += [
        "",
        "## 6. Checkpoint cost",
        "",
        f"A model of {checkpoint['parameters'] / 1e6:.1f} M parameters with SGD momentum state, 2 processes (torchrun, gloo),"
        f" a {checkpoint['file_mb']:.0f} MB `last.pt`; {args.repeats} saves.",
        "",
        f"- rank 0 in `save()`: {fmt(checkpoint['rank0_in_save_s'])} s, of which writing the file (`torch.save` + fsync + rename): {fmt(checkpoint['rank0_write_s'])} s",
        f"- rank 1 in `save()`: {fmt(checkpoint['rank1_in_save_s'])} s; until the next epoch's first collective completes: {fmt(checkpoint['rank1_wait_s'])} s",
        "",
        "Rank 1 waits only for rank 0's save: it gathers the RNG states and returns, then the next collective waits"
        " for rank 0 to finish writing. "
        + mark(checkpoint["rank1_wait_s"]["median"] <= checkpoint["rank0_in_save_s"]["median"] * 1.1)
        + " (wait <= rank 0's save).",
        "",
    ]
    path.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=TEMPLATE / "build" / "bench")
    parser.add_argument("--quick", action="store_true", help="fewer epochs and repetitions, to try the scripts")
    parser.add_argument(
        "--suite", action=argparse.BooleanOptionalAction, default=True, help="time the test command too"
    )
    args = parser.parse_args()
    args.epochs, args.repeats = (3, 1) if args.quick else (20, 3)

    info = machine()
    training = bench_training.measure(args.work, args.epochs, args.repeats)
    archive = bench_archive.measure(args.work, args.repeats)
    checkpoint = checkpoint_cost(args.work, max(args.repeats, 3))
    baking = bench_bake.measure(args.work, args.suite)
    raw = {"machine": info, "training": training, "archive": archive, "baking": baking, "checkpoint": checkpoint}
    (HERE / "results.json").write_text(json.dumps(raw, indent=2))
    write_chart(training, HERE / "parity.png")
    write_results(HERE / "RESULTS.md", info, training, archive, baking, checkpoint, args)
    print(f"wrote {HERE / 'RESULTS.md'} and {HERE / 'parity.png'}")


if __name__ == "__main__":
    sys.exit(main())
