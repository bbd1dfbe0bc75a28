"""Train the model: one process, or many started by run.sh.

python run.py [--epochs N ...]      one process (CPU or one GPU)
NPROC_PER_NODE=2 bash run.sh ...    several processes, with the chosen launcher
"""
# ruff: noqa: E402 (the quiet-start lines below must run before paddle is imported)

import os
import time
import warnings
from pathlib import Path

# Quiet start: paddle's import warns that ccache, used only to compile C++ extensions, is missing,
# and its C++ core logs each connection at INFO level.
warnings.filterwarnings("ignore", "No ccache found")
os.environ.setdefault("GLOG_minloglevel", "1")

import paddle

from {{ cookiecutter.project_slug }} import archive, cli, distributed, engine, loaders, logs, platforms, preemption
from {{ cookiecutter.project_slug }}.checkpoint import Checkpointer
from {{ cookiecutter.project_slug }}.data import build_datasets
from {{ cookiecutter.project_slug }}.errors import explain_user_errors
from {{ cookiecutter.project_slug }}.model import build_model


@explain_user_errors
def train(args) -> None:
    stop = preemption.StopRequest.on_sigterm()  # from now on SIGTERM means: save at the next step, then exit
    env = distributed.setup(args.device, args.dist_timeout)
    try:
        log = logs.setup_logging(args.output_dir, env.rank)
        archive.prepare_dataset(args, env.local_rank)
        train_set, val_set, num_classes = build_datasets(args)
        train_loader, val_loader = loaders.build_loaders(train_set, val_set, args, env)

        engine.seed_everything(args.seed)  # the same initial weights on every rank
        model = distributed.wrap_model(build_model(num_classes), env, args.find_unused_parameters)
        engine.seed_everything(args.seed + env.rank)  # then each rank its own random stream
        scheduler = engine.cosine_schedule(args.lr, args.epochs)
        optimizer = paddle.optimizer.Momentum(scheduler, momentum=0.9, parameters=model.parameters())
        optimizer = distributed.wrap_optimizer(optimizer)
        scaler = paddle.amp.GradScaler(enable=args.amp and env.on_gpu)

        output_dir = Path(args.output_dir)
        checkpoints = Checkpointer(output_dir / "checkpoints", env, model, optimizer, scaler)
        start_epoch, best_acc, progress = checkpoints.resume(args.resume)
        engine.reapply_schedule(scheduler)
        metrics_path = output_dir / "metrics.jsonl"
        if env.is_main:
            logs.drop_metrics_after(metrics_path, start_epoch)

        global_batch = args.batch_size * env.world_size * args.grad_accum
        log.info(
            "%d process(es) on %s; batch %d per process x %d x %d accumulation = global batch %d; %d train / %d val samples",
            env.world_size, env.device, args.batch_size, env.world_size, args.grad_accum, global_batch,
            len(train_set), len(val_set),
        )  # fmt: skip
        if start_epoch >= args.epochs:
            log.info("nothing to train: the checkpoint is at epoch %d and --epochs is %d", start_epoch, args.epochs)
        for epoch in range(start_epoch + 1, args.epochs + 1):
            started = time.perf_counter()
            train_loader.batch_sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
            train_stats = engine.train_one_epoch(
                model, train_loader, optimizer, scaler, env, args, epoch, progress, stop
            )  # fmt: skip
            if train_stats is None:  # stopped part-way: `progress` says where
                checkpoints.save(epoch - 1, best_acc, is_best=False, progress=progress)
                preemption.leave(epoch, progress, checkpoints.last_path)
            progress = preemption.EpochProgress()
            val_stats = engine.evaluate(model, val_loader, env, scaler.is_enable())
            lr = optimizer.get_lr()  # the rate this epoch trained with
            scheduler.step()
            is_best = val_stats["acc"] > best_acc
            best_acc = max(best_acc, val_stats["acc"])
            record = logs.epoch_record(
                epoch, train_stats, val_stats, lr=lr, world_size=env.world_size, global_batch_size=global_batch,
                started=started,
            )  # fmt: skip
            logs.report_epoch(metrics_path, record, args.epochs, env.is_main)
            checkpoints.save(epoch, best_acc, is_best)
            if epoch < args.epochs and stop.stop_now(env, vote_now=True):
                preemption.leave(epoch, progress, checkpoints.last_path)
        log.info("done: best val_acc %.4f; checkpoint: %s", best_acc, checkpoints.last_path.resolve())
        # Leave together: a rank that tears down the group while a peer is still talking to it can abort.
        distributed.barrier()
    finally:
        distributed.cleanup()


if __name__ == "__main__":
    args = cli.parse_args()
    platforms.start_this_machine(args)  # ModelArts: `python run.py --init_method ...` runs this machine's part
    distributed.launch(train, args)
