"""--tracking: where rank 0 logs a run's options, its loss and its epoch metrics. The framework's own curves
(tracking.Tracker: TensorBoard or VisualDL), or an experiment tracker that compares runs:

- mlflow: a run per run (per fold) in the experiment named after the project, in a local store of the job's output
  folder (sqlite:///OUTPUT_DIR/mlflow.db, artifacts in OUTPUT_DIR/mlartifacts; with --folds the folds' folder's, so
  that one `mlflow ui` shows every fold), or the server MLFLOW_TRACKING_URI names.
- wandb: offline unless WANDB_MODE says otherwise (cluster nodes have no internet: `wandb sync` sends the run
  later), its files under OUTPUT_DIR/wandb/.

Both take the options (config.yaml's) as the run's parameters, every metrics.jsonl number at step = epoch (epoch/...),
the loss at each logged optimizer step (train/loss) and the best checkpoint's path. A resumed run continues the same
tracker run (its id kept in OUTPUT_DIR/tracker_runs.json); options it changed are tagged (MLflow's parameters cannot
change). Each package is imported on rank 0 only, when the run starts.
"""

import json
import logging
import os
import time
from pathlib import Path

from . import tracking
from .logs import TrackerBase, epoch_numbers

RUN_IDS = "tracker_runs.json"


def open_tracker(
    name: str, output_dir, env, state, batches_per_epoch: int, grad_accum: int, batch_size: int, options: dict,
    changed: dict, resumed: bool, job_dir=None,
) -> TrackerBase:  # fmt: skip
    """The tracker `name` of a run in `output_dir` that goes on from `state` (TrackerBase.resuming()), its run begun:
    `options` its parameters, `changed` ({name: (was, now)}) what a resumed run changed; `job_dir` the job's folder
    (with --folds, the folds' folder)."""
    kind = {"mlflow": MLflow, "wandb": Wandb}.get(name, tracking.Tracker)
    tracker = kind.resuming(output_dir, env, name != "none", state, batches_per_epoch, grad_accum, batch_size)
    if tracker.active and kind is not tracking.Tracker:
        run_name = str(Path(output_dir).relative_to(Path(job_dir).parent)) if job_dir else Path(output_dir).name
        tracker.begin(
            options, changed, _run_id(output_dir, name) if resumed else None, Path(job_dir or output_dir), run_name
        )
        _keep_run_id(output_dir, name, tracker.run_id)
    return tracker


def _run_ids(output_dir) -> dict:
    """OUTPUT_DIR/tracker_runs.json: each tracker's run id ({} where there is none yet)."""
    try:
        return json.loads((Path(output_dir) / RUN_IDS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _run_id(output_dir, name: str) -> str | None:
    return _run_ids(output_dir).get(name)


def _keep_run_id(output_dir, name: str, run_id: str) -> None:
    (Path(output_dir) / RUN_IDS).write_text(json.dumps({**_run_ids(output_dir), name: run_id}), encoding="utf-8")


class MLflow(TrackerBase):
    PACKAGE, FOLDER = "mlflow", "mlartifacts"

    def begin(self, options: dict, changed: dict, run_id: str | None, job_dir: Path, run_name: str) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # not its "Creating initial MLflow database tables..."
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.client = MlflowClient(uri or f"sqlite:///{job_dir.resolve() / 'mlflow.db'}")
        if run_id is not None:
            try:
                self.client.update_run(run_id, status="RUNNING")
            except MlflowException:  # (the store was removed, or MLFLOW_TRACKING_URI names another)
                logging.getLogger(__package__).info(
                    "MLflow has no run %s in its store: the run goes on in a new one", run_id
                )
            else:
                self.run_id = run_id
                for option, (was, now) in changed.items():
                    self.client.set_tag(run_id, f"changed.{option}", f"{was} -> {now}")
                return
        experiment = self.client.get_experiment_by_name(__package__)
        experiment_id = (
            experiment.experiment_id
            if experiment
            else self.client.create_experiment(
                __package__, artifact_location=None if uri else (job_dir.resolve() / self.FOLDER).as_uri()
            )
        )
        self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self.client.log_batch(self.run_id, params=[Param(key, str(value)) for key, value in options.items()])

    def loss(self, step: int, value: float) -> None:
        if self.active:
            self.client.log_metric(self.run_id, "train/loss", float(value), step=step)

    def epoch(self, epoch: int, record: dict) -> None:
        if self.active:
            from mlflow.entities import Metric

            now = int(1000 * time.time())
            metrics = [Metric(key, value, now, epoch) for key, value in epoch_numbers(record).items()]
            self.client.log_batch(self.run_id, metrics=metrics)

    def best(self, path: Path | None) -> None:
        super().best(path)
        if self.active and path is not None:
            self.client.set_tag(self.run_id, "best_checkpoint", str(path.resolve()))

    def close(self) -> None:
        if self.active and getattr(self, "run_id", None):
            self.client.set_terminated(self.run_id, "FINISHED" if self.finished else "KILLED")


class Wandb(TrackerBase):
    PACKAGE = FOLDER = "wandb"

    def begin(self, options: dict, changed: dict, run_id: str | None, job_dir: Path, run_name: str) -> None:
        import wandb

        # Its service's logs under OUTPUT_DIR/wandb too, not in ~/.cache/wandb (WANDB_CACHE_DIR set: there).
        os.environ.setdefault("WANDB_CACHE_DIR", str(self.directory / "cache"))
        self.run = wandb.init(
            project=__package__, dir=str(self.directory.parent), id=run_id, resume="allow", name=run_name,
            group=job_dir.name if run_name != Path(run_name).name else None, config=options,
            mode=os.environ.get("WANDB_MODE", "offline"), settings=wandb.Settings(console="off", silent=True),
        )  # fmt: skip
        self.run_id = self.run.id
        self.run.define_metric("train/*", step_metric="optimizer_step")
        self.run.define_metric("epoch/*", step_metric="epoch")
        if changed:
            self.run.config.update({option: now for option, (_, now) in changed.items()}, allow_val_change=True)
            self.run.tags = (*self.run.tags, *(f"changed.{option}" for option in changed))

    def loss(self, step: int, value: float) -> None:
        if self.active:
            self.run.log({"train/loss": float(value), "optimizer_step": step})

    def epoch(self, epoch: int, record: dict) -> None:
        if self.active:
            self.run.log({**epoch_numbers(record), "epoch": epoch})

    def best(self, path: Path | None) -> None:
        super().best(path)
        if self.active and path is not None:
            self.run.summary["best_checkpoint"] = str(path.resolve())

    def close(self) -> None:
        if self.active and getattr(self, "run", None) is not None:
            self.run.finish(exit_code=0 if self.finished else 1)
            self.run = None
