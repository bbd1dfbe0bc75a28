"""Loop parity, interleaved: a baked project's training and validation loops against a plain loop.

Runs loop_parity.py in one job of 2 processes per configuration: both loops train the same
wrapped model on the project's data, taking turns epoch by epoch. Each pair of neighbouring
epochs gives one ratio (baked / plain); the figures are their median, min and max. On a machine
whose speed drifts from one minute to the next, this is the measurement that compares like with
like; whole runs of each (bench_training.py) drift apart by more than the bar.
"""

import json
import statistics
import subprocess
from pathlib import Path

from common import arguments, bake, extract_sample, summary, tool_env

HERE = Path(__file__).resolve().parent
CONFIGS = [  # (name, answers): the loop is the same for every launcher of a framework, the wrappers are not
    ("PyTorch (DDP; torchrun, launch, spawn)", {"framework": "pytorch"}),
    ("Paddle (DataParallel; launch, spawn)", {"framework": "paddle", "launcher": "launch"}),
    ("Paddle fleetrun (fleet wrappers)", {"framework": "paddle", "launcher": "fleetrun"}),
]


def run_loops(project: Path, framework: str, epochs: int, output: Path) -> dict:
    output.mkdir(parents=True, exist_ok=True)
    seconds_file = output / "seconds.json"
    script, args = str(HERE / "loop_parity.py"), [str(project), str(epochs), str(seconds_file), framework]
    if framework == "pytorch":
        command = ["torchrun", "--standalone", "--nproc-per-node", "2", script, *args]
    else:
        command = ["python", "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_level", "WARNING",
                   "--log_dir", str(output / "logs"), script, *args]  # fmt: skip
    subprocess.run(command, cwd=project, env=tool_env(OMP_NUM_THREADS="1"), check=True, capture_output=True)
    return json.loads(seconds_file.read_text())


def measure(work: Path, epochs: int) -> dict:
    results = {}
    for index, (name, answers) in enumerate(CONFIGS):
        print(f"[loop] {name}", flush=True)
        project = bake(work / "projects" / f"loop{index}", **answers)
        extract_sample(project)
        seconds = run_loops(project, answers["framework"], epochs, work / "loops" / str(index))
        # Epochs 1 and 2 warm up; each later pair ran back to back.
        baked, plain = seconds["baked"][2:], seconds["plain"][2:]
        results[name] = {
            "pairs": len(baked),
            "baked_epoch_s": summary(baked),
            "plain_epoch_s": summary(plain),
            "ratio": summary([b / p for b, p in zip(baked, plain, strict=True)]),
            "ratio_of_medians": statistics.median(baked) / statistics.median(plain),
        }
    return results


def main() -> dict:
    args = arguments(__doc__, epochs=60)
    return measure(args.work, args.epochs)


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
