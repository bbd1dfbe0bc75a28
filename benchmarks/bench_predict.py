"""Prediction at scale: predict.sh's images per second on 2 processes, its images decoded with or without workers.

A folder of 100,000 generated 8x8 grey PNG files (the sample digits' size), in 100 subfolders; a baked
default PyTorch project, trained 2 epochs on its sample digits (the checkpoint is kept in the work folder
and reused). Each repetition runs `bash predict.sh` with 2 processes on the CPU once per --workers value,
in turn first: --workers 0 decodes in each process itself, as predict.py did before it had loader workers.
Images per second are over the whole command (start-up and the CSV included); the ratio is against
--workers 0 in the same repetition. Every run must write the same CSV.

    python benchmarks/bench_predict.py [--work build/bench] [--repeats 3] [--images 100000]
"""

import argparse
import json
import subprocess
import time
from pathlib import Path

import numpy as np
from common import bake, fmt, summary, tool_env
from PIL import Image

IMAGES, WORKERS = 100_000, (0, 1, 2)


def make_images(folder: Path, count: int) -> None:
    """count random 8x8 grey PNG files, 1,000 a folder; kept for the next run."""
    done = folder / f".{count}-written"
    if done.exists():
        return
    rng = np.random.default_rng(0)
    for index in range(count):
        path = folder / f"{index // 1000:03d}" / f"{index:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8), mode="L").save(path)
    done.touch()


def trained_checkpoint(project: Path, output: Path) -> Path:
    checkpoint = output / "checkpoints" / "best.pt"
    if not checkpoint.exists():
        command = ["bash", "run.sh", "--epochs", "2", "--device", "cpu", "--output-dir", str(output)]
        subprocess.run(command, cwd=project, env=tool_env(NPROC_PER_NODE="2"), check=True, capture_output=True)
    return checkpoint


def predict_seconds(project: Path, checkpoint: Path, images: Path, workers: int, output: Path) -> float:
    command = ["bash", "predict.sh", "--checkpoint", str(checkpoint), "--input", str(images), "--device", "cpu",
               "--workers", str(workers), "--output", str(output)]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, cwd=project, env=tool_env(NPROC_PER_NODE="2"), check=True, capture_output=True)
    return time.perf_counter() - started


def measure(work: Path, repeats: int, count: int = IMAGES) -> dict:
    images = work / "predict" / f"images-{count}"
    make_images(images, count)
    project = bake(work / "projects" / "predict", framework="pytorch")
    checkpoint = trained_checkpoint(project, work / "predict" / "output")
    seconds = {workers: [] for workers in WORKERS}
    for repeat in range(repeats):
        order = WORKERS[repeat % len(WORKERS) :] + WORKERS[: repeat % len(WORKERS)]
        for workers in order:
            print(f"[predict] repeat {repeat + 1}/{repeats}, --workers {workers}", flush=True)
            output = work / "predict" / f"workers-{workers}.csv"
            seconds[workers].append(predict_seconds(project, checkpoint, images, workers, output))
        written = {(work / "predict" / f"workers-{workers}.csv").read_bytes() for workers in WORKERS}
        assert len(written) == 1, "the number of workers changed the predictions"
    return {
        "images": count,
        "repeats": repeats,
        "images_per_s": {str(w): summary([count / s for s in seconds[w]]) for w in WORKERS},
        "vs_no_workers": {
            str(w): summary([none / s for none, s in zip(seconds[0], seconds[w], strict=True)]) for w in WORKERS
        },
    }


def section(figures: dict) -> list[str]:
    """The section of RESULTS.md."""
    lines = [
        "## 8. Prediction at scale (`bench_predict.py`)",
        "",
        f"`bash predict.sh` of a baked PyTorch project, 2 processes on the CPU, on a folder of {figures['images']:,}",
        "generated 8x8 grey PNG files; the whole command timed, start-up included. `--workers 0` decodes the",
        "images in each process, as `predict.py` did before it had loader workers; every run wrote the same CSV.",
        f"{figures['repeats']} repetitions, the runs of one repetition in turn first.",
        "",
        "| `--workers` per process | images / s | images / s, against `--workers 0` |",
        "|---|---|---|",
    ]
    for workers, rate in figures["images_per_s"].items():
        ratio = "1" if workers == "0" else fmt(figures["vs_no_workers"][workers], 2)
        lines.append(f"| {workers} | {fmt(rate, 0)} | {ratio} |")
    return [*lines, ""]


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("build/bench"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images", type=int, default=IMAGES)
    args = parser.parse_args()
    figures = measure(args.work, args.repeats, args.images)
    print("\n".join(section(figures)))
    return figures


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
