"""The GPU benchmark: does the baked project keep a GPU as busy as it can be kept?

A ResNet-18 (the CIFAR variant: a 3x3 stem, no max-pool) with Adam, batch 128, one process, on CIFAR-shaped
random data, in images per second of training:
- limit       a plain loop with the data already on the GPU, float16 autocast, eager: what the GPU can do
              (measured again at the end: whether the machine's speed held);
- tutorial    the loop our users start from: a DataLoader over a TensorDataset, no workers, autocast;
- baked       the baked project's `bash run.sh` with its defaults, the network and data plugged in through
              build_model() / build_optimizer() / build_datasets(), as a user ports them; and with --compile;
- folder      the baked project on a folder of generated PNG files (its own image reader), with its
              default workers (and with --workers 0 as well, with --workers-0).
The baked figures come from its metrics.jsonl (train_samples over epoch_time_s, epochs 2 and later; the
validation set is small, so its pass costs little), the others from timing epochs the same way: the steady
state, without the first epoch, which holds --compile's compiling; that time, the first step's, is given apart
(the run's own log line).

    python benchmarks/bench_gpu.py --project BAKED_PYTORCH_PROJECT [--epochs 3] [--samples 20480] [--workers-0]
        [--rows limit "baked --compile" ...]

The default samples make whole batches: --compile compiles once for them (an epoch's last, smaller batch would
compile once more, in the first epoch). Most of the benchmark's time is the baked runs' start-up and compiling:
on one H100 its default rows took 203 s with 20,000 samples, --workers-0 about 40 s more (2026-11-28).

A machine without cookiecutter (the GPU machine) takes a project baked elsewhere; without --project one is
baked here. --device cpu --samples 512 runs the same code on a CPU, as a check of the benchmark itself.
It prints RESULTS.md's GPU section and writes its figures to benchmarks/results-gpu.json, from which
`make bench` (run_all.py) writes that section again.
"""

import argparse
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
BATCH, VAL_SAMPLES, CLASSES = 128, 512, 10

NETWORK = '''"""ResNet-18, CIFAR variant, for bench_gpu.py."""

from torch import nn


class Block(nn.Module):
    def __init__(self, inputs, outputs, stride):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, stride, 1, bias=False), nn.BatchNorm2d(outputs), nn.ReLU(inplace=True),
            nn.Conv2d(outputs, outputs, 3, 1, 1, bias=False), nn.BatchNorm2d(outputs),
        )
        self.skip = nn.Sequential()
        if stride != 1 or inputs != outputs:
            self.skip = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False), nn.BatchNorm2d(outputs))

    def forward(self, x):
        return (self.body(x) + self.skip(x)).relu()


def resnet18(num_classes=10, channels=3):
    layers, width = [], 64
    for outputs, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
        layers.append(Block(width, outputs, stride))
        width = outputs
    return nn.Sequential(
        nn.Conv2d(channels, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), *layers,
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes),
    )
'''

PORTED_MODEL = """

import torch as _torch
from bench_net import resnet18 as _resnet18


def build_model(num_classes, channels=3):  # noqa: F811 - bench_gpu.py ports its network, as a user would
    return _resnet18(num_classes, channels)


def build_optimizer(model, lr):  # noqa: F811
    return _torch.optim.Adam(model.parameters(), lr=1e-3)
"""

PORTED_DATA = """

import torch as _torch
from torch.utils.data import TensorDataset as _TensorDataset


def build_datasets(args):  # noqa: F811 - bench_gpu.py's in-memory random data
    generator = _torch.Generator().manual_seed(0)
    samples = int(__import__("os").environ["BENCH_SAMPLES"])
    train = _torch.randn(samples, 3, 32, 32, generator=generator), _torch.randint(0, 10, (samples,), generator=generator)
    val = _torch.randn({val}, 3, 32, 32, generator=generator), _torch.randint(0, 10, ({val},), generator=generator)
    return _TensorDataset(*train), _TensorDataset(*val), 10
""".replace("{val}", str(VAL_SAMPLES))


def network() -> nn.Module:
    namespace: dict = {}
    exec(NETWORK, namespace)
    return namespace["resnet18"]()


def random_data(samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(samples, 3, 32, 32, generator=generator)
    return images, torch.randint(0, CLASSES, (samples,), generator=generator)


def timed_epochs(epochs: int, one_epoch) -> float:
    """Images per second: the median over epochs 2 and later (the first one warms up)."""
    rates = [one_epoch() for _ in range(epochs)]
    return statistics.median(rates[1:])


def plain_loop(device: str, samples: int, epochs: int, data_on_device: bool) -> float:
    """The limit (the data on the device, indexed there) or the tutorial's loop (a DataLoader, no workers)."""
    torch.manual_seed(0)
    model = network().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device, enabled=device == "cuda")
    loss_fn = nn.CrossEntropyLoss()
    images, labels = random_data(samples)
    if data_on_device:
        images, labels = images.to(device), labels.to(device)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), BATCH, shuffle=True)

    def one_epoch() -> float:
        started = time.perf_counter()
        if data_on_device:
            order = torch.randperm(samples, device=device)
            batches = ((images[order[i : i + BATCH]], labels[order[i : i + BATCH]]) for i in range(0, samples, BATCH))
        else:
            batches = ((x.to(device, non_blocking=True), y.to(device, non_blocking=True)) for x, y in loader)
        for x, y in batches:
            with torch.autocast(device, dtype=torch.float16 if device == "cuda" else torch.bfloat16):
                loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        if device == "cuda":
            torch.cuda.synchronize()
        return samples / (time.perf_counter() - started)

    return timed_epochs(epochs, one_epoch)


def ported_project(project: Path, work: Path) -> Path:
    """A copy of the baked project with the benchmark's network and optimizer, and its data in memory."""
    ported = work / "project"
    shutil.rmtree(ported, ignore_errors=True)
    shutil.copytree(project, ported, ignore=shutil.ignore_patterns("output", "__pycache__"))
    (ported / "bench_net.py").write_text(NETWORK)
    package = next(path.parent for path in ported.glob("*/model.py"))
    (package / "model.py").write_text((package / "model.py").read_text() + PORTED_MODEL)
    return ported


def with_memory_data(ported: Path) -> Path:
    memory = ported.with_name("project_memory")
    shutil.rmtree(memory, ignore_errors=True)
    shutil.copytree(ported, memory)
    data_py = next(memory.glob("*/data.py"))
    data_py.write_text(data_py.read_text() + PORTED_DATA)
    return memory


def image_folder(work: Path, samples: int) -> Path:
    """train/ and val/ of CIFAR-sized random PNG files, in 10 class folders."""
    from PIL import Image

    root = work / f"images-{samples}"
    if (root / "done").exists():
        return root
    rng = np.random.default_rng(0)
    for split, count in (("train", samples), ("val", VAL_SAMPLES)):
        for index in range(count):
            folder = root / split / str(index % CLASSES)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{index}.png")
    (root / "done").touch()
    return root


def baked_run(project: Path, *args: str, work: Path, name: str, epochs: int, samples: int, device: str) -> dict:
    """The run's steady rate and data_wait (epochs 2 and later), its first log line, and its compile time when
    it compiled."""
    output = work / f"out-{name}"
    shutil.rmtree(output, ignore_errors=True)
    env = dict(os.environ, NPROC_PER_NODE="1", BENCH_SAMPLES=str(samples))
    command = ["bash", "run.sh", "--epochs", str(epochs), "--batch-size", str(BATCH), "--output-dir", str(output)]
    command += ["--device", "gpu" if device == "cuda" else "cpu", "--no-tracking", *args]
    result = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
    log = (output / "train.log").read_text().splitlines()
    first_line = next(line for line in log if "process(es)" in line)
    compiled = [line.split(" took ")[1].split(" s")[0] for line in log if "--compile: the first step took" in line]
    return {
        "images_per_s": statistics.median(row["train_samples"] / row["epoch_time_s"] for row in rows[1:]),
        "data_wait": statistics.median(row["data_wait"] for row in rows[1:]),
        "log": first_line.split(" ", 2)[2],
        **({"compile_s": float(compiled[0])} if compiled else {}),
    }


def machine(device: str) -> dict:
    return {
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "cores": len(os.sched_getaffinity(0)),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


NOT_MEASURED = """## 7. GPU (`bench_gpu.py`): no results-gpu.json

No `benchmarks/results-gpu.json` was at hand where this file was written, so this section has no table, and
its goals are neither met nor missed by one; the dated notes below say what GPU stays saw. The benchmark runs
where a GPU is (`python benchmarks/bench_gpu.py --project <a baked PyTorch project>`; a GPU machine without
cookiecutter takes a project baked elsewhere); it writes `benchmarks/results-gpu.json`, which the next `make
bench` turns into this section.

What it measures, in images per second of training (ResNet-18, CIFAR variant, Adam, batch 128, one
process): the limit (a plain loop with the data already on the GPU, float16 autocast, eager), the
tutorial loop (a DataLoader over a TensorDataset, no workers), the baked project's `run.sh` with its
defaults and with `--compile` on in-memory data, and on a folder of generated PNG files with its default
workers (and with `--workers 0`, with `--workers-0`); then the limit again. Goals: the baked defaults reach
at least 0.9 of the limit on in-memory data and are not loader-bound on the image folder (`data_wait` under
0.5) but at the limit there too; `--compile` reaches at least 1.1 of the eager limit.
"""
NOTES = HERE / "gpu-notes.md"  # dated notes of GPU stays, kept by hand: section 7 ends with them


def section(result: dict | None, notes: str = "") -> list[str]:
    """The GPU section of RESULTS.md, from bench_gpu.py's results (None: not measured), ending with `notes`."""
    notes_lines = notes.strip().splitlines() + [""] if notes.strip() else []
    if result is None:
        return NOT_MEASURED.splitlines() + [""] + notes_lines
    rows, info = result["rows"], result["machine"]
    limit = rows["limit"]["images_per_s"]

    def goal(met: bool) -> str:
        return "meets the goal" if met else "**misses the goal**"

    lines = [
        "## 7. GPU (`bench_gpu.py`)",
        "",
        f"{info['device']}, {info['cores']} cores; torch {info['torch']}, CUDA {info['cuda']}, Python {info['python']}.",
        f"ResNet-18 (CIFAR variant), Adam, batch {BATCH}, one process, {result['samples']:,} samples,"
        f" {result['epochs']} epochs; images per second of training, the median over epochs 2 and later (the"
        " steady state); the compile time is the first training step's, compiling included, as the run logs it."
        + (f" The benchmark took {result['wall_s']:.0f} s." if "wall_s" in result else ""),
        "",
        "| run | images / s | of the limit | data_wait | compile (s) | the run's first log line |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        wait = f"{row['data_wait']:.2f}" if "data_wait" in row else ""
        compiled = f"{row['compile_s']:.1f}" if "compile_s" in row else ""
        lines.append(
            f"| {name} | {row['images_per_s']:.0f} | {row['images_per_s'] / limit:.2f} | {wait} | {compiled}"
            f" | {row.get('log', '')} |"
        )
    lines.append("")
    if "baked" in rows:
        share = rows["baked"]["images_per_s"] / limit
        lines.append(
            f"- the baked defaults on in-memory data: {share:.2f} of the limit {goal(share >= 0.9)} (at least 0.9)"
        )
    if "folder" in rows:
        share, wait = rows["folder"]["images_per_s"] / limit, rows["folder"]["data_wait"]
        lines.append(
            f"- the baked defaults on the image folder: data_wait {wait:.2f} {goal(wait < 0.5)} (under 0.5), and"
            f" {share:.2f} of the limit {goal(share >= 1)} (at least 1)"
        )
    if "baked --compile" in rows:
        share = rows["baked --compile"]["images_per_s"] / limit
        lines.append(f"- `--compile`: {share:.2f} of the eager limit {goal(share >= 1.1)} (at least 1.1)")
    if "limit, again" in rows:
        drift = rows["limit, again"]["images_per_s"] / limit
        held = "held" if 0.9 <= drift <= 1.1 else "**moved: these figures decide no goal**"
        lines.append(f"- the limit at the end: {drift:.2f} of the first; the machine's speed {held}")
    expected = ("limit", "tutorial", "baked", "baked --compile", "folder", "limit, again")
    missing = [name for name in expected if name not in rows]
    if missing:
        lines.append(f"- not measured (the run was cut short, or --rows left them out): {', '.join(missing)}")
    return lines + [""] + notes_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--project", type=Path, help="a baked PyTorch project (default: bake one here)")
    parser.add_argument("--work", type=Path, default=HERE / "work-gpu")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=160 * BATCH)
    parser.add_argument("--out", type=Path, default=HERE / "results-gpu.json")
    parser.add_argument(
        "--workers-0",
        action="store_true",
        help="also the image folder with --workers 0 (what the loader's workers win)",
    )
    parser.add_argument("--rows", nargs="+", metavar="ROW", help="only these rows, by name (a short GPU stay)")
    args = parser.parse_args()
    started = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.project is None:
        sys.path.insert(0, str(HERE))
        from common import bake

        args.project = bake(args.work / "baked")
    ported = ported_project(args.project, args.work)
    memory = with_memory_data(ported)
    folder = image_folder(args.work, args.samples)
    folder_args = ("--data-dir", str(folder), "--image-size", "32", "--channels", "3")

    baked = functools.partial(baked_run, work=args.work, epochs=args.epochs, samples=args.samples, device=args.device)
    runs = {
        "limit": lambda: {"images_per_s": plain_loop(args.device, args.samples, args.epochs, data_on_device=True)},
        "tutorial": lambda: {"images_per_s": plain_loop(args.device, args.samples, args.epochs, data_on_device=False)},
        "baked": lambda: baked(memory, name="baked"),
        "baked --compile": lambda: baked(memory, "--compile", name="compile"),
        "folder": lambda: baked(ported, *folder_args, name="folder"),
        "folder --workers 0": lambda: baked(ported, *folder_args, "--workers", "0", name="folder0"),
        # The limit once more: a GPU machine's speed can move within minutes (by 75 % on 2026-11-28).
        "limit, again": lambda: {
            "images_per_s": plain_loop(args.device, args.samples, args.epochs, data_on_device=True)
        },
    }
    if not args.workers_0:
        del runs["folder --workers 0"]
    if args.rows:
        unknown = set(args.rows) - set(runs)
        if unknown:
            parser.error(f"no row {', '.join(sorted(unknown))}; the rows: {', '.join(runs)}")
        runs = {name: run for name, run in runs.items() if name in args.rows}
    result = {"machine": machine(args.device), "samples": args.samples, "epochs": args.epochs, "rows": {}}
    for name, run in runs.items():  # each figure as it comes: a run cut short still keeps what it measured
        result["rows"][name] = run()
        result["wall_s"] = time.perf_counter() - started
        args.out.write_text(json.dumps(result, indent=2))
        print(f"{name}: {result['rows'][name]['images_per_s']:.0f} images/s ({result['wall_s']:.0f} s)", flush=True)
    print("\n".join(section(result)))


if __name__ == "__main__":
    main()
