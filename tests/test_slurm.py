"""Slow tier: baked projects trained through slurm/train.sbatch on a real two-node SLURM cluster.

The cluster (tests/slurm_cluster.py) runs on this host: nodes n1 and n2, 4 CPUs each. Every job of
this module is submitted at once, when the first test asks for them, so that they run together; each
test then waits for its own jobs. The preflight checks take seconds: they go first. The time-limit job
sleeps through its steps and runs the longest: it goes next.
"""

import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import LAUNCH_CASES, PREFLIGHT_CHECKS, RECOMMENDED_CASES, run, tool_env

# One SLURM cluster a session, so all of its tests run in the same test process.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]

SBATCH = "slurm/train.sbatch"
TRAIN_SIZE, VAL_SIZE = 1437, 360  # the sample digits archive
ARGS = ["--epochs", "2", "--log-every", "1"]
# A folder of the check's own: the training job of the same project writes output/ meanwhile.
CHECK_ARGS = ("--check", "--output-dir", "check-output")
FOLDS_OUTPUT = "folds-output"
TIME_LIMIT_EPOCHS = 9  # 23 steps of 0.6 s each: 124 s of training at least, more than a first run before its warning
SLOW_STEPS = """

import time

_build_model = build_model


def build_model(num_classes):  # noqa: F811 - a test slows every training step, to stop a job part-way
    model = _build_model(num_classes)
    model.register_forward_pre_hook(lambda module, inputs: time.sleep({seconds}) if module.training else None)
    return model
"""


def case_id(answers: dict) -> str:
    return "-".join(answers.values())


def nodes_for(answers: dict) -> int:
    """Paddle's spawn launcher runs on one machine only (nodes=single): every other case takes two."""
    return 1 if answers["framework"] == "paddle" and answers["launcher"] == "spawn" else 2


def sharding(answers: dict) -> tuple[str, ...]:
    """The --strategy of a launch case's job: a sharded one (PyTorch's fsdp, the sharding of Paddle's basic loop)
    for all but the scancel test's uninterrupted reference (its answers are a RECOMMENDED_CASES one), which
    trains as the cancelled job does, and paddle.Model.fit(), which does not shard."""
    if answers in RECOMMENDED_CASES or answers.get("paddle_api") == "highlevel":
        return ()
    return ("--strategy", "fsdp" if answers["framework"] == "pytorch" else "sharding")


@dataclass
class Job:
    project: Path
    options: tuple[str, ...]
    args: tuple[str, ...]
    nproc: int
    id: str = ""

    @property
    def output(self) -> Path:
        return self.project / "output"

    def log(self) -> str:
        """slurm/train.sbatch's log, slurm-JOBID.out, appended to by every run of the job."""
        path = self.project / f"slurm-{self.id}.out"
        return path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""

    def submit(self, cluster) -> "Job":
        env = tool_env(NPROC_PER_NODE=str(self.nproc))
        self.id = cluster.sbatch(SBATCH, *self.args, cwd=self.project, options=self.options, env=env)
        return self


def read_metrics(output: Path) -> list[dict]:
    path = output / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


TIMINGS = ("epoch_time_s", "data_wait")  # clock readings, not results


def without_timings(metrics: list[dict]) -> list[dict]:
    return [{key: value for key, value in record.items() if key not in TIMINGS} for record in metrics]


def ended(cluster, job: Job, timeout_s: float = 600) -> dict:
    record = cluster.wait(job.id, timeout_s)
    assert record, f"job {job.id} was purged before the test could read it"
    return record


def assert_completed(record: dict, job: Job) -> None:
    assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), f"job {job.id}: {record}\n{job.log()}"


@dataclass
class Cancelled:
    state: str  # of the cancelled job
    stopped: list[tuple[str, str]]  # (epoch, step) of each "stopped by SIGTERM" line
    epochs_done: int
    again: Job  # the same sbatch command, submitted once the cancelled job had ended


def cancel_then_submit_again(cluster, job: Job) -> Cancelled:
    """scancel the job part-way through epoch 1, wait for it to end, then submit the same command again."""
    train_log = job.output / "train.log"
    cluster.wait_for(
        lambda: train_log.exists() and "epoch 1 step 3/" in train_log.read_text(encoding="utf-8"),
        timeout_s=600,
        what=f"job {job.id} to log epoch 1 step 3",
    )
    cluster.scancel(job.id)
    state = ended(cluster, job, timeout_s=120)["JobState"]
    stopped = re.findall(r"stopped by SIGTERM after epoch (\d+) step (\d+)", train_log.read_text(encoding="utf-8"))
    epochs_done = len(read_metrics(job.output))
    return Cancelled(state, stopped, epochs_done, Job(job.project, job.options, job.args, job.nproc).submit(cluster))


def bake(cookies_session, slow_step_s: float = 0.0, **answers) -> Path:
    result = cookies_session.bake(extra_context=answers)
    assert result.exit_code == 0, f"baking {answers} failed: {result.exception}"
    project = Path(result.project_path)
    if slow_step_s:
        with open(project / "dist_train" / "model.py", "a", encoding="utf-8") as model:
            model.write(SLOW_STEPS.format(seconds=slow_step_s))
    return project


@pytest.fixture(scope="module")
def recommended(cookies_session) -> dict[str, Path]:
    """The project a new user of each framework bakes first, its steps slowed for the scancel test."""
    return {case_id(answers): bake(cookies_session, 0.2, nodes="multi", **answers) for answers in RECOMMENDED_CASES}


@pytest.fixture(scope="module")
def checks(cluster, recommended) -> dict[str, Job]:
    """`sbatch slurm/train.sbatch --check` on two machines, in each recommended project."""
    return {
        case: Job(project, ("--nodes=2",), CHECK_ARGS, nproc=2).submit(cluster) for case, project in recommended.items()
    }


@pytest.fixture(scope="module")
def jobs(cluster, cookies_session, recommended, checks) -> dict:  # checks: submitted first, as they are short
    submitted: dict = {}
    canceller = ThreadPoolExecutor(max_workers=len(RECOMMENDED_CASES))
    # Two machines with one process each; --time=3 as a user would write it, the warning offset from the file.
    submitted["time limit"] = Job(
        bake(cookies_session, 0.6, framework="pytorch", launcher="torchrun", nodes="multi"),
        ("--nodes=2", "--time=3"),
        ("--epochs", str(TIME_LIMIT_EPOCHS), "--log-every", "5"),
        nproc=1,
    ).submit(cluster)
    # A fold in each array task, on a machine each, in a folder of their own (the cancel test trains in output/).
    submitted["folds"] = Job(
        recommended[case_id(RECOMMENDED_CASES[0])],
        ("--array=0-1", "--nodes=1", "--output=slurm-%A_%a.out"),
        ("--folds", "2", "--epochs", "1", "--output-dir", FOLDS_OUTPUT),
        nproc=2,
    ).submit(cluster)
    for answers in RECOMMENDED_CASES:
        job = Job(recommended[case_id(answers)], ("--nodes=2",), tuple(ARGS), nproc=2).submit(cluster)
        # Each job is cancelled as soon as it is part-way through, whichever test runs meanwhile.
        submitted["cancel", case_id(answers)] = job, canceller.submit(cancel_then_submit_again, cluster, job)
    for answers in LAUNCH_CASES:
        nodes = nodes_for(answers)
        project = bake(cookies_session, nodes="multi" if nodes > 1 else "single", **answers)
        args = (*ARGS, *sharding(answers))
        submitted[case_id(answers)] = Job(project, (f"--nodes={nodes}",), args, nproc=2).submit(cluster)
    yield submitted
    canceller.shutdown(wait=False, cancel_futures=True)


@pytest.mark.parametrize("answers", RECOMMENDED_CASES, ids=case_id)
def test_scancel_saves_and_sbatch_again_ends_with_the_metrics_of_an_uninterrupted_job(cluster, jobs, answers):
    job, cancelling = jobs["cancel", case_id(answers)]

    cancelled = cancelling.result(timeout=900)

    assert cancelled.state == "CANCELLED"
    assert cancelled.stopped and cancelled.stopped[0][0] == "1", f"no save on scancel:\n{job.log()}"
    assert cancelled.epochs_done < 2
    again = cancelled.again
    assert_completed(ended(cluster, again), again)
    step = cancelled.stopped[0][1]
    assert f"(epoch 1, step {step})" in (job.output / "train.log").read_text(encoding="utf-8")  # went on from there
    reference = jobs[case_id(answers)]  # the same answers and arguments, never interrupted
    assert_completed(ended(cluster, reference), reference)
    resumed, uninterrupted = without_timings(read_metrics(job.output)), without_timings(read_metrics(reference.output))
    # Four ranks sum gradients in another order in the first step after a start: equal to float32 rounding.
    assert [m["epoch"] for m in resumed] == [m["epoch"] for m in uninterrupted] == [1, 2]
    for epoch, reference_epoch in zip(resumed, uninterrupted, strict=True):
        assert epoch == pytest.approx(reference_epoch, rel=1e-6)


@pytest.mark.parametrize("answers", LAUNCH_CASES, ids=case_id)
def test_sbatch_on_two_machines_trains_one_job_of_four_processes(cluster, jobs, answers):
    job = jobs[case_id(answers)]
    nodes = nodes_for(answers)

    record = ended(cluster, job)

    assert_completed(record, job)
    assert record["NumNodes"] == str(nodes)
    metrics = read_metrics(job.output)
    assert [m["epoch"] for m in metrics] == [1, 2]
    for epoch in metrics:
        assert epoch["world_size"] == 2 * nodes
        assert epoch["train_samples"] == TRAIN_SIZE
        assert epoch["val_samples"] == VAL_SIZE
    # run.sh's line saying what it found, once per machine: SLURM, and on several machines the master by its
    # host name (one machine hosts its own rendezvous, on 127.0.0.1).
    found = [line for line in job.log().splitlines() if "SLURM" in line and not line.startswith("slurm/train.sbatch")]
    assert len(found) == nodes, job.log()
    if nodes > 1:
        master = cluster.command("scontrol", "show", "hostnames", record["NodeList"]).stdout.split()[0]
        assert all(re.search(rf"\b{master}\b", line) for line in found), found
    else:
        assert all("machine 0 of 1" in line for line in found), found
    if sharding(answers):  # what a user sees of it: its line, and a folder of shards where ddp writes last.*
        assert f"strategy {sharding(answers)[1]}" in job.log(), job.log()
        checkpoints = job.output / "checkpoints"
        assert (checkpoints / "last").is_dir() and not list(checkpoints.glob("last.*")), list(checkpoints.iterdir())


def test_an_array_job_trains_the_fold_of_each_task_and_cv_py_scores_the_folds(cluster, jobs):
    job = jobs["folds"]

    for task in (0, 1):
        array_task = Job(job.project, job.options, job.args, job.nproc, id=f"{job.id}_{task}")
        record = ended(cluster, array_task)
        log = (job.project / f"slurm-{job.id}_{task}.out").read_text(encoding="utf-8", errors="replace")
        assert (record["JobState"], record["ExitCode"]) == ("COMPLETED", "0:0"), f"{record}\n{log}"
        fold = job.project / FOLDS_OUTPUT / f"fold-{task}"
        assert f"fold {task} of 2" in (fold / "train.log").read_text(encoding="utf-8")
        assert (fold / "oof.csv").is_file() and len(read_metrics(fold)) == 1

    scored = run([sys.executable, "cv.py", FOLDS_OUTPUT], job.project)
    assert scored.returncode == 0 and re.fullmatch(r"cv: oof_acc \S+; folds \S+ \+- \S+ \(2 folds\)\n", scored.stdout)


def test_a_job_that_reaches_its_time_limit_saves_requeues_itself_and_trains_every_epoch_once(cluster, jobs):
    job = jobs["time limit"]

    record = ended(cluster, job, timeout_s=900)

    assert_completed(record, job)
    restarts = int(record["Restarts"])
    assert restarts >= 1, job.log()
    log = job.log()
    runs = re.findall(r"^slurm/train\.sbatch: job \d+ run (\d+)", log, flags=re.M)
    assert runs == [str(run) for run in range(1, restarts + 2)]  # one log, appended to by every run
    assert log.count("the time limit is near: saving, then requeueing") == restarts
    # Every run trained: each requeued run went on from further than the one before it. (The warning may
    # come just as the last epoch ends: the run after it then only finds nothing left to train.)
    train_log = (job.output / "train.log").read_text(encoding="utf-8")
    points = re.findall(r"resumed from .* \(epoch (\d+)(?:, step (\d+))?\)", train_log)
    resumed = [(int(e), int(s)) if s else (int(e) + 1, 0) for e, s in points]  # "(epoch E)": E is done
    assert len(resumed) == restarts and resumed == sorted(set(resumed)) and resumed[0] > (0, 0), resumed
    assert "stopped by SIGTERM after epoch" in train_log
    metrics = read_metrics(job.output)
    assert [m["epoch"] for m in metrics] == list(range(1, TIME_LIMIT_EPOCHS + 1))
    assert all(m["train_samples"] == TRAIN_SIZE and m["world_size"] == 2 for m in metrics)


@pytest.mark.parametrize("answers", RECOMMENDED_CASES, ids=case_id)
def test_sbatch_check_on_two_machines_says_ready_on_both_and_trains_nothing(cluster, checks, answers):
    job = checks[case_id(answers)]

    record = ended(cluster, job, timeout_s=300)

    assert_completed(record, job)
    log = job.log()
    # run.sh on each machine got --check: each says every check, and its verdict (the two machines' lines interleave).
    for name in PREFLIGHT_CHECKS:
        assert log.count(f"\ncheck {name}: ") == 2, log
    verdicts = [line for line in log.splitlines() if line.startswith(("ready: ", "error: "))]
    assert len(verdicts) == 2, log
    assert all(line.startswith("ready: 2 machine(s) x 2 process(es), ") for line in verdicts), log
    # Nothing trained, nothing left in the check's folder (the check removes its own files, run.sh the launcher's).
    folder = job.project / CHECK_ARGS[-1]
    left = {path.name for path in folder.iterdir()} if folder.exists() else set()
    assert not left, left
