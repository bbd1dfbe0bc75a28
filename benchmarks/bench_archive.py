"""Archive extraction: a baked project's ensure_extracted() against `unzip -q` and zipfile.extractall().

The archive is generated: about 20,000 small files of random bytes (which, like JPEG or PNG
images, do not compress) in train/<class>/ and val/<class>/ folders, about 200 MB. Each
repetition extracts it with the three tools in turn into fresh folders; the figures are
throughput ratios to unzip in the same repetition. Then a second start: ensure_extracted() on
the folder it already filled, which must only check its marker.
"""

import json
import os
import random
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from common import arguments, bake, summary

FILES, FILE_BYTES = 20_000, 10_000


def make_archive(path: Path) -> int:
    if path.exists():
        return path.stat().st_size
    rng = random.Random(0)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for index in range(FILES):
            split = "val" if index % 5 == 0 else "train"
            archive.writestr(f"{split}/class{index % 10}/image{index:05d}.png", rng.randbytes(FILE_BYTES))
    return path.stat().st_size


def timed(action) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def main() -> dict:
    args = arguments(__doc__, repeats=3)
    return measure(args.work, args.repeats)


def measure(work: Path, repeats: int) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    archive = work / "many_files.zip"
    archive_bytes = make_archive(archive)
    project = bake(work / "projects" / "archive", dataset="zip")
    sys.path.insert(0, str(project))
    from dist_train.archive import ensure_extracted

    targets = {name: work / "extract" / name for name in ("unzip", "extractall", "baked")}
    seconds = {name: [] for name in targets}
    tools = {
        "unzip": lambda: subprocess.run(["unzip", "-q", str(archive), "-d", str(targets["unzip"])], check=True),
        "extractall": lambda: zipfile.ZipFile(archive).extractall(targets["extractall"]),
        "baked": lambda: ensure_extracted(archive, targets["baked"], show_progress=False),
    }
    names = list(tools)
    for repeat in range(repeats):
        print(f"[archive] repeat {repeat + 1}/{repeats}", flush=True)
        for name in names[repeat % 3 :] + names[: repeat % 3]:  # each tool goes first once in three
            shutil.rmtree(targets[name], ignore_errors=True)
            targets[name].mkdir(parents=True)
            os.sync()  # the writes of the tool before must not slow this one down
            seconds[name].append(timed(tools[name]))
    second_start = [timed(lambda: ensure_extracted(archive, targets["baked"], show_progress=False)) for _ in range(5)]
    return {
        "files": FILES,
        "archive_mb": archive_bytes / 1e6,
        "seconds": {name: summary(values) for name, values in seconds.items()},
        "throughput_vs_unzip": {
            name: summary([u / s for u, s in zip(seconds["unzip"], values, strict=True)])
            for name, values in seconds.items()
        },
        "second_start_s": summary(second_start),
    }


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
