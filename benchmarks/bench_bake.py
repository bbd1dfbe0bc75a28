"""Baking and testing: seconds to bake each combination of answers, and the whole test command.

Every combination of the choices in cookiecutter.json that the pre-generation hook accepts is
baked in this process, three times each into fresh folders (the median counts); the default one
also with the cookiecutter command, as a user runs it. The test command is the README's: `make test`, on this machine, as CI runs it.
"""

import argparse
import importlib.util
import itertools
import json
import os
import shutil
import statistics
import subprocess
import time
import zipfile
from pathlib import Path

from common import BIN, TEMPLATE, summary, tool_env
from cookiecutter.main import cookiecutter

CHOICES = ("framework", "launcher", "nodes", "dataset", "install_requirements", "paddle_api")


def answer_combinations() -> list[dict]:
    """Every combination the pre-generation hook accepts (PyTorch without the Paddle-only question)."""
    template = json.loads((TEMPLATE / "cookiecutter.json").read_text())
    launchers = ("torchrun", "spawn", "launch", "fleetrun")  # the template renders its launcher list per framework
    values = [launchers if name == "launcher" else template[name] for name in CHOICES]
    hook = importlib.util.spec_from_file_location("pre_gen_project", TEMPLATE / "hooks" / "pre_gen_project.py")
    pre_gen = importlib.util.module_from_spec(hook)
    hook.loader.exec_module(pre_gen)
    combinations = [dict(zip(CHOICES, combination, strict=True)) for combination in itertools.product(*values)]
    return [
        answers
        for answers in combinations
        if pre_gen.find_problem(answers | {"project_slug": "dist_train"}) is None
        and not (answers["framework"] == "pytorch" and answers["paddle_api"] != "basic")
    ]


def unpack_floor(work: Path, repeats: int) -> dict:
    """Seconds this disk takes to write the sample images alone: zipfile.extractall of the sample archive."""
    sample = TEMPLATE / "{{cookiecutter.project_slug}}" / "data" / "digits.zip"
    timings = []
    for repeat in range(repeats):
        started = time.perf_counter()
        with zipfile.ZipFile(sample) as archive:
            archive.extractall(work / "unpack" / str(repeat))
        timings.append(time.perf_counter() - started)
    shutil.rmtree(work / "unpack")
    return summary(timings)


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("build/bench"))
    parser.add_argument("--suite", action=argparse.BooleanOptionalAction, default=True, help="also time make test")
    args = parser.parse_args()
    return measure(args.work, args.suite)


def measure(work: Path, with_suite: bool, repeats: int = 3) -> dict:
    output = work / "bakes"
    shutil.rmtree(output, ignore_errors=True)
    os.sync()  # the benchmarks before wrote and deleted GBs: their write-back must not slow the bakes down
    seconds = {}
    for index, answers in enumerate(answer_combinations()):
        timings = []
        for repeat in range(repeats):  # each into a folder of its own: deleting the last bake is not baking
            started = time.perf_counter()
            cookiecutter(
                str(TEMPLATE), no_input=True, output_dir=str(output / f"{index}-{repeat}"), extra_context=answers
            )
            timings.append(time.perf_counter() - started)
        seconds["-".join(answers.values())] = statistics.median(timings)
    started = time.perf_counter()
    command = [str(BIN / "cookiecutter"), "--no-input", str(TEMPLATE), "-o", str(output / "command")]
    subprocess.run(command, check=True, env=tool_env())
    command_s = time.perf_counter() - started
    shutil.rmtree(output, ignore_errors=True)
    folder = [value for name, value in seconds.items() if "-folder-" in name]
    others = [value for name, value in seconds.items() if "-folder-" not in name]
    result = {
        "combinations": len(seconds),
        "bake_s": summary(list(seconds.values())),
        "folder_bake_s": summary(folder),
        "other_bake_s": summary(others),
        "sample_unpack_s": unpack_floor(work, repeats),
        "command_bake_s": command_s,
        "slowest": max(seconds, key=seconds.get),
    }
    if with_suite:
        print("[bake] make test (the whole suite) ...", flush=True)
        started = time.perf_counter()
        suite = subprocess.run(["make", "test"], cwd=TEMPLATE, capture_output=True, text=True, env=tool_env())
        result["suite_s"] = time.perf_counter() - started
        result["suite_summary"] = suite.stdout.strip().splitlines()[-1] if suite.stdout.strip() else ""
        result["suite_status"] = suite.returncode
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
