"""Sharded training at scale: the training time a checkpoint costs, written in the background or not, and the
bytes each process holds for the model.

A baked PyTorch project; a model of 28 M parameters (three 3072 x 3072 linear layers), Adam; torchrun (gloo, CPU):
- memory: engine.training_memory() (parameters, gradients and optimizer state, per process) with --strategy fsdp
  on 1 process and on 2, and ddp on 2;
- save cost, 2 processes: the fsdp model trains STEPS optimizer steps saving every EVERY steps through the
  project's Checkpointer (due() and save_progress(), as engine.train_one_epoch() does, which skips the epoch's
  last step), with save_in_background(False) (sync), True (async, its last save waited for and counted), and
  with no saves (the reference): the three in turn in one job, a different one first in each repetition. The
  time a save costs training is (the run's time - the reference's) / SAVES, within each repetition; and per
  save, from its call to the end of the EVERY steps after it, less the same steps' time without saves;
- step cost, 2 processes: a training step of the sample model (model.py's, --model-option width=4096: 4.3 M
  parameters, batch 32 of 16 x 16 images, SGD) through distributed.wrap_model() with --strategy ddp and fsdp, and
  fsdp with --no-reshard-after-forward (FSDP2's reshard_after_forward=False: its units keep their gathered parameters
  from forward to backward, no second all-gather, the full parameters held meanwhile), in turn; and gloo's own collectives on the largest
  layer's 4.2 M floats: all-reduce (what ddp sends per step), all-gather and reduce-scatter (what fsdp sends per
  unit and step).

    python benchmarks/bench_scale.py [--work build/bench] [--repeats 5]
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import torch
from common import bake, fmt, summary, tool_env
from torch import nn

# On 2 CPU processes a step (mostly FSDP's all-gathers and reduce-scatters over gloo) takes longer than a background
# save's write: a save every 2 steps is hidden as well as one every 1,000, and gives the saves' cost a larger share
# of a run's time than the other jobs' noise.
WIDTH, BATCH, EVERY, SAVES = 3072, 64, 2, 5
STEPS = (SAVES + 1) * EVERY  # the loop never saves at its last step: SAVES saves, each followed by EVERY steps
MODES = ("reference", "sync", "async")
STEP_WIDTH, STEP_BATCH, TIMED_STEPS = 4096, 32, 25
STEP_VARIANTS = ("ddp", "fsdp", "fsdp, reshard_after_forward=False")
HERE = Path(__file__).resolve().parent


def build(env, strategy: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    from dist_train import distributed

    torch.manual_seed(0)
    layers = [nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH)]
    model = distributed.wrap_model(nn.Sequential(*layers), env, strategy=strategy)
    return model, torch.optim.Adam(model.parameters(), lr=1e-5)


def memory(env) -> dict:
    from dist_train import engine

    held = {}
    for strategy in ("fsdp", "ddp"):
        parameters, held[strategy] = engine.training_memory(*build(env, strategy))
    return {"parameters": parameters, "bytes_per_process": held}


def train(model, optimizer, saver, batch: torch.Tensor) -> tuple[float, list[float]]:
    """Seconds for STEPS steps and their saves, the last background save written included; and per save, the
    seconds from its call to the end of the EVERY steps after it (the last: to the end of its wait). A run
    without saves gives the same stretches, steps only."""
    from dist_train import distributed
    from dist_train.preemption import EpochProgress

    distributed.barrier()
    started = time.perf_counter()
    stepped = [started]  # when each step's optimizer step ended, before its save
    for step in range(1, STEPS + 1):
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stepped.append(time.perf_counter())
        if saver is not None and step < STEPS and saver.due(step):
            saver.save_progress(EpochProgress(step, 0.0, step * BATCH, step * BATCH * saver.env.world_size))
    if saver is not None:
        saver.wait_for_save()
    stepped[-1] = time.perf_counter()
    distributed.barrier()  # every rank done: the slower one's time
    saves = range(EVERY, STEPS, EVERY)
    return time.perf_counter() - started, [stepped[step + EVERY] - stepped[step] for step in saves]


def save_cost(env, output: Path, repeats: int) -> dict:
    from dist_train import engine
    from dist_train.checkpoint import Checkpointer

    model, optimizer = build(env, "fsdp")
    schedule = engine.cosine_schedule(optimizer, epochs=1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    savers = {}
    for mode in ("sync", "async"):
        savers[mode] = Checkpointer(output / mode, env, model, optimizer, schedule, scaler)
        savers[mode].every_steps = EVERY
        savers[mode].save_in_background(mode == "async")
    batch = torch.randn(BATCH, WIDTH)
    seconds = {mode: [] for mode in MODES}
    stretches = {mode: [] for mode in MODES}  # per repetition, train()'s stretches
    # Repetition -1 is not counted: Adam's state is made, the background saves' process group created.
    for repeat in range(-1, repeats):
        order = MODES[repeat % len(MODES) :] + MODES[: repeat % len(MODES)]
        for mode in order:
            took, stretched = train(model, optimizer, savers.get(mode), batch)
            if repeat >= 0:
                seconds[mode].append(took)
                stretches[mode].append(stretched)
    saved = savers["sync"].last_path.resolve()
    return {"seconds": seconds, "stretches": stretches, "save_bytes": sum(f.stat().st_size for f in saved.iterdir())}


def step_model(env, variant: str) -> nn.Module:
    from dist_train import distributed
    from dist_train.model import build_model

    torch.manual_seed(0)
    network = build_model(num_classes=10, channels=1, width=STEP_WIDTH)
    strategy = variant.split(",")[0]  # ("fsdp, reshard_after_forward=False": --no-reshard-after-forward)
    return distributed.wrap_model(network, env, strategy=strategy, reshard_after_forward="False" not in variant)


def median_step(model: nn.Module, optimizer, images: torch.Tensor, labels: torch.Tensor) -> float:
    from dist_train import distributed

    took = []
    for _ in range(TIMED_STEPS):
        distributed.barrier()
        started = time.perf_counter()
        nn.functional.cross_entropy(model(images), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        took.append(time.perf_counter() - started)
    return median(took[3:])  # (the first steps allocate)


def step_cost(env, repeats: int) -> dict:
    """Median step seconds per variant and repetition (the variants in turn), and gloo's collectives' seconds."""
    import torch.distributed as dist

    models = {variant: step_model(env, variant) for variant in STEP_VARIANTS}
    optimizers = {
        variant: torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) for variant, model in models.items()
    }
    images, labels = torch.randn(STEP_BATCH, 1, 16, 16), torch.randint(0, 10, (STEP_BATCH,))
    steps = {variant: [] for variant in STEP_VARIANTS}
    for repeat in range(repeats):
        order = STEP_VARIANTS[repeat % 3 :] + STEP_VARIANTS[: repeat % 3]
        for variant in order:
            steps[variant].append(median_step(models[variant], optimizers[variant], images, labels))
    whole = torch.randn(STEP_WIDTH * 1024)  # the largest layer's weight: 1024 x 4096
    shard, gathered = torch.randn(whole.numel() // env.world_size), torch.empty_like(whole)
    collectives = {
        "all-reduce": lambda: dist.all_reduce(whole),
        "all-gather": lambda: dist.all_gather_into_tensor(gathered, shard),
        "reduce-scatter": lambda: dist.reduce_scatter_tensor(shard, whole),
    }
    timed = {}
    for name, collective in collectives.items():
        took = []
        for _ in range(TIMED_STEPS):
            dist.barrier()
            started = time.perf_counter()
            collective()
            took.append(time.perf_counter() - started)
        timed[name] = median(took[3:])
    return {"step_s": steps, "collective_s": timed}


def worker(project: Path, output: Path, repeats: int) -> None:
    """One torchrun job: rank 0 prints its figures as one line of JSON."""
    sys.path.insert(0, str(project))
    from dist_train import distributed

    torch.set_num_threads(1)  # one core per process: the machine has 2
    env = distributed.setup("cpu", 600)
    figures = memory(env)
    if env.world_size > 1:
        if env.is_main:
            shutil.rmtree(output, ignore_errors=True)
        distributed.barrier()
        figures |= save_cost(env, output, repeats) | step_cost(env, repeats)
    if env.is_main:
        print(json.dumps(figures))
    distributed.cleanup()


def measure(work: Path, repeats: int) -> dict:
    project = bake(work / "projects" / "scale", framework="pytorch")
    jobs = {}
    for processes in (1, 2):
        command = ["torchrun", "--standalone", "--nproc-per-node", str(processes), HERE / "bench_scale.py", "--worker", str(project),
                   "--work", str(work), "--repeats", str(repeats)]  # fmt: skip
        print(f"[scale] {processes} process(es), {repeats} repetitions", flush=True)
        result = subprocess.run(command, capture_output=True, text=True, env=tool_env(OMP_NUM_THREADS="1"), check=True)
        jobs[processes] = json.loads(result.stdout.strip().splitlines()[-1])
    one, two = jobs[1]["bytes_per_process"], jobs[2]["bytes_per_process"]
    seconds, stretches = jobs[2]["seconds"], jobs[2]["stretches"]
    lost = {
        mode: [(s - r) / SAVES for s, r in zip(seconds[mode], seconds["reference"], strict=True)]
        for mode in ("sync", "async")
    }
    # The same, robust to the other jobs' bursts: per repetition, the median stretch after a save against the
    # median stretch of the same steps without saves.
    stretch_lost = {
        mode: [median(s) - median(r) for s, r in zip(stretches[mode], stretches["reference"], strict=True)]
        for mode in ("sync", "async")
    }
    return {
        "parameters": jobs[2]["parameters"],
        "bytes_per_process": {
            "fsdp, 1 process": one["fsdp"],
            "fsdp, 2 processes": two["fsdp"],
            "ddp, 2 processes": two["ddp"],
        },
        "fsdp_2_over_1": two["fsdp"] / one["fsdp"],
        "save_mb": jobs[2]["save_bytes"] / 1e6,
        "steps": STEPS,
        "every": EVERY,
        "saves": SAVES,
        "repeats": repeats,
        "run_s": {mode: summary(seconds[mode]) for mode in MODES},
        "lost_per_save_s": {mode: summary(values) for mode, values in lost.items()},
        "stretch_lost_per_save_s": {mode: summary(values) for mode, values in stretch_lost.items()},
        "async_over_sync": summary([a / s for a, s in zip(stretch_lost["async"], stretch_lost["sync"], strict=True)]),
    } | step_figures(jobs[2])


def step_figures(job: dict) -> dict:
    """step_cost()'s figures: each variant's median step, its ratio to ddp's within each repetition, and gloo's
    collectives."""
    steps = job["step_s"]
    return {
        "step_s": {variant: summary(values) for variant, values in steps.items()},
        "step_over_ddp": {
            variant: summary([s / d for s, d in zip(values, steps["ddp"], strict=True)])
            for variant, values in steps.items()
        },
        "collective_s": job["collective_s"],
        "step_repeats": len(steps["ddp"]),
    }


def section(figures: dict) -> list[str]:
    """The section of RESULTS.md."""
    lost, stretch = figures["lost_per_save_s"], figures["stretch_lost_per_save_s"]
    lines = [
        "## 9. Sharded training at scale (`bench_scale.py`)",
        "",
        f"A model of {figures['parameters'] / 1e6:.1f} M parameters (three 3072 x 3072 linear layers), Adam, batch"
        f" {BATCH} per process, torchrun (gloo, CPU), one core per process.",
        "",
        "**Bytes per process** of parameters, gradients and Adam's two states (`engine.training_memory()`, what",
        "run.py logs):",
        "",
        "| strategy, processes | MB per process |",
        "|---|---|",
    ]
    lines += [f"| {name} | {held / 1e6:.1f} |" for name, held in figures["bytes_per_process"].items()]
    lines += [
        "",
        f"fsdp on 2 processes holds {figures['fsdp_2_over_1']:.3f} of what it holds on 1 (bar: 0.5).",
        "",
        f"**Training time a save costs**, 2 processes, `--strategy fsdp`: {figures['steps']} optimizer steps with a"
        f" save every {figures['every']} ({figures['saves']} saves of {figures['save_mb']:.0f} MB, each rank its",
        "shards), through the baked `Checkpointer` as `engine.train_one_epoch()` calls it; sync",
        "(`save_in_background(False)`), async (`True`, `--save-async`; the last save waited for and counted),",
        f"and no saves. The three in turn in one job, a different one first each time; {figures['repeats']}"
        " repetitions.",
        "Training time lost per save, within each repetition: over whole runs, (run with saves - run without) /",
        "saves; and, robust to the other jobs' bursts, the median over a run's saves of the stretch from a save's",
        f"call to the end of the {figures['every']} steps after it (the last save: of its wait), less the median of",
        "the same steps' stretches without saves.",
        "",
        "| run | run s | lost per save, whole runs, s | lost per save, stretch medians, s |",
        "|---|---|---|---|",
        f"| no saves (reference) | {fmt(figures['run_s']['reference'], 2)} | 0 | 0 |",
        f"| sync saves | {fmt(figures['run_s']['sync'], 2)} | {fmt(lost['sync'], 2)} | {fmt(stretch['sync'], 2)} |",
        f"| async saves | {fmt(figures['run_s']['async'], 2)} | {fmt(lost['async'], 2)} | {fmt(stretch['async'], 2)} |",
        "",
        f"Async / sync time lost per save (stretch medians): {fmt(figures['async_over_sync'], 2)}.",
        "",
    ]
    return lines + step_section(figures)


def step_section(figures: dict) -> list[str]:
    """The step cost's part of the section."""
    steps, ratios, collective = figures["step_s"], figures["step_over_ddp"], figures["collective_s"]
    floor = collective["all-gather"] + collective["reduce-scatter"] - collective["all-reduce"]
    lines = [
        f"**A step's cost, fsdp against ddp**, 2 processes (gloo, one core each): the sample model with"
        f" `--model-option width={STEP_WIDTH}` (4.3 M parameters, 4.2 M of them in one linear layer), batch"
        f" {STEP_BATCH} of 16 x 16 images, SGD; the median of {TIMED_STEPS - 3} steps, the variants in turn,"
        f" {figures['step_repeats']} repetitions; the ratio to ddp within each repetition.",
        "",
        "| strategy | step ms | against ddp |",
        "|---|---|---|",
    ]
    lines += [
        f"| {variant} | {fmt({k: v * 1000 for k, v in steps[variant].items() if k != 'n'}, 1)} |"
        f" {fmt(ratios[variant], 2)} |"
        for variant in steps
    ]
    lines += [
        "",
        f"gloo's own collectives on that layer's {STEP_WIDTH * 1024 / 1e6:.1f} M floats (medians): all-reduce"
        f" {collective['all-reduce'] * 1000:.1f} ms (ddp's per step), all-gather {collective['all-gather'] * 1000:.1f}"
        f" ms and reduce-scatter {collective['reduce-scatter'] * 1000:.1f} ms (fsdp's per step, the all-gather twice"
        " when the unit reshards after forward). With the all-gather once, fsdp's collectives take"
        f" {floor * 1000:.1f} ms more than ddp's each step, whatever FSDP2's settings: with one core per process"
        f" little of it overlaps computation, so fsdp's step is at least about"
        f" {(steps['ddp']['median'] + floor) / steps['ddp']['median']:.2f} of ddp's here, before FSDP2's own"
        " copies into and out of its flat buffers: gloo's reduce-scatter costs more than its all-reduce.",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("build/bench"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)  # a baked project: run as torchrun's rank
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.work / "scale", args.repeats)
        return
    figures = measure(args.work.resolve(), args.repeats)
    print("\n".join(section(figures)))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
