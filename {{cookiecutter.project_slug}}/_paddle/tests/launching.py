"""A script run as ranks under a launcher, for test_launch.py and test_launcher.py."""

import os
import subprocess
import sys


def launch_ranks(
    script_text: str, nproc: int, project_root, tmp_path, launcher: str = "paddle.distributed.launch"
) -> tuple[int, str]:
    """Run `script_text` as `nproc` ranks under paddle's launcher (or the project's launcher module, which run.sh
    starts): its exit status, and every worker's log."""
    script = tmp_path / "rank.py"
    script.write_text(script_text, encoding="utf-8")
    launch = [sys.executable, "-m", launcher, "--nproc_per_node", str(nproc)]
    result = subprocess.run(
        [*launch, "--log_dir", str(tmp_path / "logs"), str(script)],
        cwd=project_root, env=dict(os.environ, PYTHONPATH=str(project_root)), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    logs = "".join(path.read_text(encoding="utf-8") for path in sorted((tmp_path / "logs").glob("workerlog.*")))
    return result.returncode, logs
