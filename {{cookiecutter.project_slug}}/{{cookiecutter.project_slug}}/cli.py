"""Command-line flags of run.py and predict.py: the same for every framework and launcher, and those that data.py and
task.py declare (OPTIONS, PREDICT_OPTIONS)."""

import argparse
import os
import sys
from typing import NoReturn

from . import options, workspace
from .errors import PlatformError
from .options import (
    decay,
    model_option,
    non_negative_int,
    non_negative_number,
    number,
    path,
    positive_int,
    positive_number,
    positive_seconds,
)  # fmt: skip
from .settings import DATASET, FRAMEWORK, SAMPLE

TRACKER = "TensorBoard" if FRAMEWORK == "pytorch" else "VisualDL"
TRACKERS = (TRACKER.lower(), "mlflow", "wandb", "none")  # --tracking's; the first is the default
DEFAULT_LR = 0.05
STRATEGIES = {"pytorch": ("ddp", "fsdp", "hsdp"), "paddle": ("ddp", "sharding")}[FRAMEWORK]
STRATEGY_HELP = {
    "pytorch": "fsdp: each holds a shard of the parameters, gradients and optimizer state (FSDP2), for models "
    "that do not fit one GPU; hsdp: sharded within each machine, replicated across machines",
    "paddle": "sharding: each holds a part of the optimizer state (--sharding-stage 1), also of the gradients (2), "
    "also of the parameters (3), for models whose training state does not fit one GPU",
}[FRAMEWORK]


class OneLineParser(argparse.ArgumentParser):
    """A bad flag ends in one `error:` line, as every other bad input does, not under argparse's usage block."""

    source = None  # where the values being read come from, when not the command line (options.with_config())

    def __init__(self, **keywords):  # no abbreviations: --epoch is not --epochs, and a new option breaks no command
        super().__init__(allow_abbrev=False, **keywords)

    def error(self, message: str) -> NoReturn:
        where = f" {self.source}" if self.source else ""
        hint = options.nearest_to_unknown(message, self)
        self.exit(2, f"error: {message}{where}{hint} ({self.prog} --help lists the flags)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="run.py", description="Train on one process, or many with a launcher (see run.sh).")
    parser.add_argument(
        "--config",
        type=path,
        metavar="FILE.yaml",
        help="options from a YAML file (keys: these long names; flags given too win); a run writes its own as "
        "OUTPUT_DIR/config.yaml, which repeats it",
    )
    parser.add_argument(
        "--epochs", type=positive_int, default=10, help="epochs in total; a resumed run continues up to this"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, default=32, help="PER PROCESS; the global batch is this x world size x accum"
    )
    parser.add_argument(
        "--lr",
        type=non_negative_number,  # (0: the weights stay as they are)
        help=f"learning rate for the global batch (not scaled for you; default {DEFAULT_LR}); a resumed run keeps "
        "its own unless another is given, and then trains at it from there on, the schedule continuing from it",
    )
    parser.add_argument(
        "--warmup-epochs",
        type=non_negative_number,
        metavar="W",
        help="the learning rate rises from 0 over the first W epochs (fractions allowed), then decays on the cosine; "
        "it changes after every optimizer step; a resumed run keeps its own W unless this is given",
    )
    parser.add_argument(
        "--folds",
        type=number(int, lambda value: value >= 2, "2 or more"),
        metavar="K",
        help="split the labeled data into K folds (OUTPUT_DIR/folds.csv) and train a model per fold in "
        "OUTPUT_DIR/fold-k/, each with its out-of-fold predictions (oof.csv); then python cv.py OUTPUT_DIR",
    )
    parser.add_argument(
        "--fold",
        metavar="k|all",
        help="with --folds: train fold k (0-based; in a SLURM array task, default: its index), or all of them one "
        "after another (the default), skipping finished ones, then the cross-validation score",
    )
    parser.add_argument(
        "--patience",
        type=positive_int,
        metavar="N",
        help="stop early after N epochs in a row whose best metric (task.py's BEST_METRIC) did not improve on the "
        "best so far by more than --min-delta; a resumed run counts on",
    )
    parser.add_argument(
        "--min-delta", type=non_negative_number, default=0.0, metavar="D", help="with --patience: the least improvement"
    )
    parser.add_argument(
        "--ema",
        type=decay,
        metavar="DECAY",
        help="average the weights after every optimizer step (ema = DECAY x ema + (1 - DECAY) x weights, e.g. "
        "0.999): validation, best.*, --patience and --keep-best use the averages; checkpoints hold both; a resumed "
        "run goes on with its own DECAY unless given",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed; rank r seeds its own randomness with seed + r")
    parser.add_argument(
        "--output-dir",
        type=path,
        help="checkpoints, logs and metrics.jsonl go here (default: output/ in the project folder; "
        "on AI Studio the workspace's output/)",
    )
    parser.add_argument(
        "--resume",
        default="auto",
        type=path,
        help="auto: continue from OUTPUT_DIR/checkpoints/last.* if present; none: start afresh; or a checkpoint path",
    )
    parser.add_argument(
        "--evaluate",
        action="store_true",
        help="train nothing: evaluate the checkpoint --resume names (default: OUTPUT_DIR/checkpoints/last.*), or "
        "--init-from's, on the validation set with this job's processes; writes OUTPUT_DIR/eval.json",
    )
    parser.add_argument(
        "--init-from",
        type=path,
        metavar="PATH",
        help="a fresh start begins from these weights (a state dict, or a checkpoint of this project): those that "
        "fit the model by name and shape; the others (a new classifier head) are listed and keep their initial values",
    )
    parser.add_argument(
        "--model-option",
        type=model_option,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a keyword argument for build_model() in model.py (repeatable; e.g. the sample's width=4096), over what "
        "the data fills in; checkpoints record it for predict.py (a resumed run needs it given again)",
    )
    synthetic = DATASET == "synthetic"
    parser.add_argument(
        "--synthetic", action=argparse.BooleanOptionalAction, default=synthetic, help="random data, no dataset read"
    )
    parser.add_argument(
        "--data-dir",
        type=path,
        help="the unpacked dataset, as data.py reads it (its docstring says what it holds), or one folder holding "
        f"it (default: data/{SAMPLE}, or a folder beside --dataset-zip named after it)",
    )
    parser.add_argument(
        "--dataset-zip",
        type=path,
        help="archive (.zip, .tar, .tar.gz) extracted into --data-dir once per node before training"
        + (f" (default: none; without --data-dir, data/{SAMPLE}.zip)" if DATASET == "zip" else ""),
    )
    options.add(parser, "OPTIONS")
    batches = parser.add_mutually_exclusive_group()
    batches.add_argument("--grad-accum", type=positive_int, default=1, help="micro-batches per optimizer step")
    batches.add_argument(
        "--global-batch-size",
        type=positive_int,
        metavar="G",
        help="keep the global batch at G on any number of processes: the accumulation steps are G / (--batch-size x "
        "world size), which must be whole; a resumed run keeps the G it was started with",
    )
    parser.add_argument(
        "--strategy",
        choices=STRATEGIES,
        default="ddp",
        help="ddp: every process holds the whole model; " + STRATEGY_HELP,
    )
    if "sharding" in STRATEGIES:
        parser.add_argument(
            "--sharding-stage",
            type=int,
            choices=(1, 2, 3),
            default=1,
            help="with --strategy sharding: 1 shards the optimizer state (CPUs and GPUs), 2 also the gradients, 3 "
            "also the parameters (GPUs only)",
        )
    parser.add_argument(
        "--reshard-after-forward",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="PyTorch's --strategy fsdp and hsdp: each unit frees its gathered parameters after its forward and "
        "gathers them again for its backward (the least memory); --no-reshard-after-forward keeps them until the "
        "backward: one all-gather a step less, the whole parameters held meanwhile",
    )
    parser.add_argument(
        "--activation-checkpointing",
        action="store_true",
        help="recompute the activations of the model's blocks (FSDP_UNITS in model.py) in the backward pass instead "
        "of keeping them: less memory, about a third more compute",
    )
    parser.add_argument(
        "--clip-grad-norm",
        type=positive_number,
        metavar="X",
        help="scale the gradients down where their global norm exceeds X, before each optimizer step",
    )
    parser.add_argument(
        "--save-every-steps",
        type=positive_int,
        metavar="N",
        help="also save OUTPUT_DIR/checkpoints/last (last.*, or a sharded model's last/) every N optimizer steps of an epoch: a run killed without "
        "warning (SIGKILL, a lost machine) resumes from there, losing at most N steps",
    )
    parser.add_argument(
        "--keep-best",
        type=positive_int,
        metavar="K",
        help="keep the checkpoints of the K best epochs too, listed best first in OUTPUT_DIR/checkpoints/top.json",
    )
    parser.add_argument(
        "--save-async",
        action=argparse.BooleanOptionalAction,
        help="write a sharded model's checkpoints in the background while training goes on (default: on under "
        "--strategy fsdp and hsdp)",
    )
    parser.add_argument(
        "--sync-bn",
        action="store_true",
        help="batch normalisation over the global batch (synchronised across processes; GPUs only)",
    )
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True, help="mixed precision on GPU")
    parser.add_argument(
        "--amp-dtype",
        choices=("auto", "bf16", "fp16"),
        default="auto",
        help="auto: bfloat16 where the GPU runs it natively (compute capability 8.0+), else float16 with loss scaling",
    )
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="reproducible GPU runs: deterministic algorithms only, no cuDNN autotuning (slower)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model (PyTorch; the first steps compile); checkpoints hold the plain model",
    )
    parser.add_argument(
        "--channels-last", action="store_true", help="channels-last memory format for convolution nets (PyTorch)"
    )
    parser.add_argument(
        "--log-every", type=positive_int, help="steps between loss lines (default: about five an epoch, at most 50)"
    )
    parser.add_argument(
        "--tracking",
        nargs="?",
        choices=TRACKERS,
        const=TRACKERS[0],
        default=TRACKERS[0],
        help=f"rank 0 logs the options, the loss and the epoch metrics: {TRACKERS[0]} under OUTPUT_DIR/{TRACKERS[0]}/, "
        "mlflow in OUTPUT_DIR/mlflow.db (or MLFLOW_TRACKING_URI), wandb offline under OUTPUT_DIR/wandb/ (unless "
        "WANDB_MODE says otherwise); pip install -r requirements-tracking.txt for the last two",
    )
    parser.add_argument("--no-tracking", dest="tracking", action="store_const", const="none", help="--tracking none")
    parser.add_argument(
        "--find-unused-parameters",
        action="store_true",
        help="for models with parameters that get no gradient in some steps (slower)",
    )
    parser.add_argument(
        "--extract-timeout",
        type=positive_seconds,
        default=3600.0,
        help="seconds to wait for another process (or machine, on a shared filesystem) that is extracting the archive",
    )
    parser.add_argument(
        "--check", action="store_true", help="train nothing: check that this job can start, on every machine (README)"
    )
    add_weights_flag(parser, "--evaluate")
    add_process_flags(parser)
    # What ModelArts passes to the boot file (modelarts.py, README.md).
    modelarts = parser.add_argument_group("ModelArts")
    modelarts.add_argument("--data_url", help="the dataset: a folder of data, or a folder holding its archive")
    modelarts.add_argument("--train_url", help="the same as --output-dir")
    modelarts.add_argument(
        "--init_method",
        help="tcp://HOST:PORT of machine 0: with no launcher, run.py starts this machine's processes itself "
        "(ignored under a launcher)",
    )
    modelarts.add_argument("--rank", type=non_negative_int, help="with --init_method: this machine's index")
    modelarts.add_argument("--world_size", type=positive_int, help="with --init_method: the number of machines")
    return parser


def parse_args(argv: list[str] | None = None, quiet: bool = False) -> argparse.Namespace:
    parser = _one_line_on_error(build_parser)
    args = parser.parse_args(options.with_config(parser, sys.argv[1:] if argv is None else argv))
    args.output_dir = workspace.output_dir(args.output_dir, args.train_url)  # the one place that decides it
    args.as_given = options.as_given(parser, args)  # for config.yaml: before anything is derived from them
    if args.config:  # the checks of several options below may be about a value the file gave
        parser.source = f"(with --config {args.config})"
    if getattr(args, "sharding_stage", 1) > 1 and args.strategy != "sharding":
        parser.error(f"--sharding-stage {args.sharding_stage} needs --strategy sharding")
    if getattr(args, "group_column", None) and not args.folds:  # data.py's option; only the folds read it
        parser.error(f"--group-column {args.group_column} keeps each group within one fold: it needs --folds K")
    if args.strategy == "sharding":  # the loop's name for it, and the log's
        args.strategy = f"sharding stage {args.sharding_stage}"
    try:
        workspace.place_fold(args)  # --folds: the fold's own folder
        workspace.resolve_data_paths(args, quiet)
    except PlatformError as error:
        parser.exit(2, f"error: {error}{f' {parser.source}' if parser.source else ''}\n")
    if args.local_rank is not None:  # only old torch.distributed.launch versions pass the flag without LOCAL_RANK
        os.environ.setdefault("LOCAL_RANK", str(args.local_rank))
    return args


def _one_line_on_error(build) -> argparse.ArgumentParser:
    """build()'s parser; a task option that cannot be one (options.add()) ends the process in one line."""
    try:
        return build()
    except PlatformError as error:
        raise SystemExit(f"error: {error}") from None


def parse_predict_args(argv: list[str] | None = None) -> argparse.Namespace:
    return _one_line_on_error(build_predict_parser).parse_args(argv)


def build_predict_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="predict.py",
        description="Predict every input of a file, a folder or an archive with a checkpoint, in the task's "
        "submission form (task.write_predictions(); see predict.sh).",
    )
    parser.add_argument(
        "--checkpoint",
        nargs="+",
        help="a checkpoint run.py wrote (a file, or a sharded save's folder): it holds what predicting needs (class "
        "names, how inputs were read) (default: output/'s best); several, a checkpoints/top.json (--keep-best) or "
        "the folder of a run of --folds (each fold's best): an ensemble, their outputs averaged",
    )
    parser.add_argument(
        "--tta", action="store_true", help="average the outputs over the views task.py's test_time_views() gives too"
    )
    parser.add_argument(
        "--input",
        required=True,
        help="what to predict, as data.build_predict_set() reads it (a file or a folder), or an archive of it "
        "(.zip, .tar.gz, ...)",
    )
    parser.add_argument(
        "--output", help="the file (or folder) to write, by rank 0 (default: task.write_predictions()'s)"
    )
    options.add(parser, "PREDICT_OPTIONS")
    add_weights_flag(parser, "predicting")
    parser.add_argument("--batch-size", type=positive_int, default=256, help="inputs per forward pass")
    add_process_flags(parser)
    return parser


def add_weights_flag(parser: argparse.ArgumentParser, use: str) -> None:
    """--weights: which of a checkpoint's weights `use` (--evaluate, predicting, exporting) takes."""
    parser.add_argument(
        "--weights",
        choices=("ema", "raw"),
        default="ema",
        help=f"ema: {use} uses the checkpoint's averaged weights where it holds them (a run of --ema); raw: the "
        "trained ones",
    )


def add_process_flags(parser: argparse.ArgumentParser) -> None:
    """The flags run.py and predict.py share: the device, the loader workers, the wait for the other processes,
    archive extraction."""
    parser.add_argument(
        "--device", choices=("auto", "cpu", "gpu"), default="auto", help="auto: a GPU where there is one"
    )
    parser.add_argument(
        "--workers",
        type=non_negative_int,
        help="worker processes per process that read the inputs (default: none on CPUs; on GPUs the cores each "
        "process may use, less one, at most 8)",
    )
    parser.add_argument(
        "--dist-timeout",
        type=positive_seconds,
        default=1800.0,
        help="seconds a rank waits for its peers (start-up and each collective) before stopping with an error",
    )
    parser.add_argument(
        "--archive-max-gb",
        type=float,
        default=100.0,
        help="refuse archives that declare more uncompressed data than this (zip bombs)",
    )
    # torch.distributed.launch passes --local-rank (or --local_rank on old versions);
    # the LOCAL_RANK variable it also sets is what the code reads.
    parser.add_argument("--local-rank", "--local_rank", type=int, default=None, help=argparse.SUPPRESS)
