"""What every benchmark needs: baking, running a command while watching it, and robust summaries."""

import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def tool_env(**extra: str) -> dict:
    """The environment of a user who activated the template's .venv, on CPU."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", CUDA_VISIBLE_DEVICES="")
    return env | extra


def bake(output: Path, **answers: str) -> Path:
    from cookiecutter.main import cookiecutter

    return Path(cookiecutter(str(TEMPLATE), no_input=True, output_dir=str(output), extra_context=answers))


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fmt(stats: dict, digits: int = 3) -> str:
    return f"{stats['median']:.{digits}f} [{stats['min']:.{digits}f}, {stats['max']:.{digits}f}]"


class Watched:
    """A command run to its end, with each stdout line's arrival time and every rank's memory over time.

    Ranks are the command's python processes that start no others and hold over 150 MB (the
    launchers and spawn's helpers either have children or stay small).
    """

    def __init__(self, command: list[str], cwd: Path, env: dict, sample_every: float = 0.1):
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[tuple[float, str]] = []
        self.rss: dict[int, list[tuple[float, int]]] = {}
        sampler = threading.Thread(target=self._sample, args=(sample_every,), daemon=True)
        sampler.start()
        for line in self.process.stdout:
            self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))
        self.returncode = self.process.wait()
        self.seconds = time.monotonic() - self.started
        sampler.join()
        if self.returncode != 0:
            tail = "\n".join(line for _, line in self.lines[-30:])
            raise RuntimeError(f"{' '.join(command)} failed with status {self.returncode}:\n{tail}")

    def first(self, text: str) -> float:
        return next(at for at, line in self.lines if text in line)

    def _sample(self, every: float) -> None:
        while self.process.poll() is None:
            now = time.monotonic() - self.started
            for pid in descendants(self.process.pid):
                rss = resident_bytes(pid)
                if rss > 150e6 and not children(pid):
                    self.rss.setdefault(pid, []).append((now, rss))
            time.sleep(every)


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def descendants(pid: int) -> list[int]:
    found, todo = [], children(pid)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children(pid))
    return found


def resident_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
