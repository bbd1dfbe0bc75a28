"""Baking and testing: seconds to bake each combination of answers, and the whole test command.

Every combination of the choices in cookiecutter.json that the pre-generation hook accepts is
baked in this process; the default one also with the cookiecutter command, as a user runs it. The test command is the README's: `make test`, on this machine, as CI runs it.
"""

import argparse
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from common import BIN, TEMPLATE, bake, summary, tool_env

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


def main() -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("build/bench"))
    parser.add_argument("--suite", action=argparse.BooleanOptionalAction, default=True, help="also time make test")
    args = parser.parse_args()
    return measure(args.work, args.suite)


def measure(work: Path, with_suite: bool) -> dict:
    output = work / "bakes"
    seconds = {}
    os.sync()  # the benchmarks before wrote GBs: their write-back must not slow the bakes down
    for answers in answer_combinations():
        started = time.perf_counter()
        bake(output, **answers)
        seconds["-".join(answers.values())] = time.perf_counter() - started
    shutil.rmtree(output, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run(
        [str(BIN / "cookiecutter"), "--no-input", str(TEMPLATE), "-o", str(output)], check=True, env=tool_env()
    )
    command_s = time.perf_counter() - started
    result = {"combinations": len(seconds), "bake_s": summary(list(seconds.values())), "command_bake_s": command_s}
    result["slowest"] = max(seconds, key=seconds.get)
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
