"""Train the model with paddle.Model.fit: one process, or many started by run.sh.

python run.py [--epochs N ...]      one process (CPU or one GPU)
NPROC_PER_NODE=2 bash run.sh ...    several processes, with the chosen launcher
"""
# ruff: noqa: E402 (the quiet-start lines below must run before paddle is imported)

import os
import warnings
from pathlib import Path

# Quiet start: paddle's import warns that ccache, used only to compile C++ extensions, is missing,
# and its C++ core logs each connection at INFO level.
warnings.filterwarnings("ignore", "No ccache found")
os.environ.setdefault("GLOG_minloglevel", "1")
# fit() copies each batch with paddle.to_tensor(), which warns about it.
warnings.filterwarnings("ignore", "To copy construct from a tensor")

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
        network = build_model(num_classes)
        # On several ranks paddle.Model wraps the network in DataParallel itself, calling init_parallel_env()
        # (again; under fleetrun the first time: distributed.setup() leaves joining to fleet.init(), unused here).
        with distributed.without_flag_table():
            model = paddle.Model(network)
        engine.seed_everything(args.seed + env.rank)  # then each rank its own random stream
        scheduler = engine.cosine_schedule(args.lr, args.epochs)
        optimizer = paddle.optimizer.Momentum(scheduler, momentum=0.9, parameters=network.parameters())
        use_amp = args.amp and env.on_gpu
        model.prepare(optimizer, engine.accumulated_loss(args.grad_accum), amp_configs="O1" if use_amp else None)

        output_dir = Path(args.output_dir)
        checkpoints = Checkpointer(output_dir / "checkpoints", env, network, optimizer)
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

        def end_epoch(epoch: int, train_stats: dict, started: float) -> None:
            """Validation, metrics.jsonl and checkpoints, after fit's training steps and learning-rate step."""
            nonlocal best_acc
            val_stats = engine.evaluate(network, val_loader, env, use_amp)
            is_best = val_stats["acc"] > best_acc
            best_acc = max(best_acc, val_stats["acc"])
            record = logs.epoch_record(
                epoch, train_stats, val_stats, lr=train_stats["lr"], world_size=env.world_size, global_batch_size=global_batch,
                started=started,
            )  # fmt: skip
            logs.report_epoch(metrics_path, record, args.epochs, env.is_main)
            checkpoints.save(epoch, best_acc, is_best)
            if epoch < args.epochs and stop.stop_now(env, vote_now=True):
                preemption.leave(epoch, preemption.EpochProgress(), checkpoints.last_path)

        def stop_in_epoch(epoch: int, progress: preemption.EpochProgress) -> None:
            checkpoints.save(epoch - 1, best_acc, is_best=False, progress=progress)
            preemption.leave(epoch, progress, checkpoints.last_path)

        if start_epoch >= args.epochs:
            log.info("nothing to train: the checkpoint is at epoch %d and --epochs is %d", start_epoch, args.epochs)
        else:
            model.fit(
                train_loader,
                epochs=args.epochs - start_epoch,
                verbose=0,  # EpochEnd logs instead
                accumulate_grad_batches=args.grad_accum,
                callbacks=[
                    # The cosine schedule steps once per epoch, before EpochEnd saves it (the default: every step).
                    paddle.callbacks.LRScheduler(by_step=False, by_epoch=True),
                    engine.EpochEnd(train_loader, env, args, start_epoch, progress, stop, end_epoch, stop_in_epoch),
                ],
            )
        log.info("done: best val_acc %.4f; checkpoint: %s", best_acc, checkpoints.last_path.resolve())
        # Leave together: a rank that tears down the group while a peer is still talking to it can abort.
        distributed.barrier()
    finally:
        distributed.cleanup()


if __name__ == "__main__":
    args = cli.parse_args()
    platforms.start_this_machine(args)  # ModelArts: `python run.py --init_method ...` runs this machine's part
    distributed.launch(train, args)
