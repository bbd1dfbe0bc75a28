"""The training job, step by step: what every process does, started by run.py, run.sh or notebook.launch()."""

from pathlib import Path

from . import (
    archive,
    distributed,
    engine,
    fit,
    folds,
    loaders,
    logs,
    options,
    output_folder,
    preemption,
    seam,
    trackers,
)
from .checkpoint import BEST, Checkpointer, newest
from .errors import UserError, explain_user_errors
from .logs import LoaderWatch


@explain_user_errors
def train(args) -> None:
    stop = preemption.StopRequest.on_sigterm()  # from now on SIGTERM means: save at the next step, then exit
    stop.on_signal = output_folder.say_stopping  # (and a job started meanwhile on the output folder waits for it)
    engine.configure_kernels(args.deterministic)  # before CUDA starts
    env = distributed.setup(args.device, args.dist_timeout)
    try:
        task = seam.Task()  # the three files a user owns, the one way to them; BEST_METRIC checked before any work
        folds.train_each(
            args, env, task, lambda run_args: train_one(run_args, env, stop, task), lambda: _extract_dataset(args, env)
        )  # (one run, or each fold's)
    finally:
        distributed.cleanup()


def _extract_dataset(args, env) -> None:
    """--dataset-zip extracted into --data-dir, once per machine, before any process reads the data."""
    archive.prepare_dataset(
        args.dataset_zip, args.data_dir, max_gb=args.archive_max_gb, lock_timeout=args.extract_timeout,
        local_rank=env.local_rank,
    )  # fmt: skip
    distributed.barrier("every machine's dataset extraction")  # up to --dist-timeout: a machine may be slow


def train_one(args, env, stop: preemption.StopRequest, task: seam.Task) -> None:
    """One model: the run of args.output_dir (with --folds: a fold's)."""
    lock = None
    try:
        no_checkpoints = not (args.init_from or Path(args.output_dir, "checkpoints").is_dir())
        if args.evaluate and no_checkpoints and args.resume in ("auto", "none"):
            _no_checkpoint(Path(args.output_dir), env)  # (a mistyped folder, say: before hold() writes in it)
        lock = output_folder.hold(args.output_dir, env)  # one job per output folder: before anything is written
        log = logs.setup_logging(None if args.evaluate else args.output_dir, env.rank)  # --evaluate writes no log
        model_options = task.chosen_options(args.model_option, shown=env.local_rank == 0)  # names build_model() takes
        _extract_dataset(args, env)
        train_set, val_set, outputs = folds.datasets(task, args, env.is_main)  # (a fold's, with --folds)
        train_loader, val_loader = loaders.build_loaders(
            train_set, val_set, args.batch_size, args.workers, args.seed, env
        )

        engine.seed_everything(args.seed)  # the same initial weights on every rank
        # What predicting needs (data.py's description, --model-option's), saved with every checkpoint; build_model() gets
        # the parts it names as parameters.
        data = seam.data_description(train_set, outputs, model_options)
        # --init-from under fsdp/hsdp: rank 0 alone builds the whole network, the others build it on the meta device
        # (no memory); wrap_model() sends each its shards of rank 0's weights, resume() those of the file rank 0 reads.
        with engine.whole_on_rank0_only(env, args.strategy, args.init_from):
            network = task.network(data)
        network = distributed.sync_batch_norm(network, env, args.sync_bn)
        trained = fit.prepare(network, train_loader, env, task, args)  # wrapped, its optimizer, schedule, precision
        model, amp_dtype = trained.model, trained.amp_dtype

        output_dir = Path(args.output_dir)
        best = (task.best_metric, task.best_mode)  # what picks best.*
        checkpoints = Checkpointer(
            output_dir / "checkpoints", env, model, trained.optimizer, trained.schedule, trained.scaler, data, best
        )
        checkpoints.every_steps, checkpoints.keep_best = args.save_every_steps, args.keep_best
        checkpoints.evaluating = args.evaluate
        checkpoints.save_in_background(args.save_async)
        checkpoints.ema = ema = engine.Ema(model, args.ema)  # started by resume() under --ema, or the checkpoint's
        # --evaluate --init-from PATH: those weights, whatever the folder holds.
        how = "none" if args.evaluate and args.init_from else args.resume
        state = checkpoints.resume(how, args.init_from, args.lr, args.warmup_epochs)
        if changed := seam.changed_description(checkpoints.loaded_data, data):  # (the data a run resumes on)
            log.warning("the data differs from the checkpoint's in %s: the resumed model's outputs or inputs may mean "
                        "other things now (--resume none trains afresh)", ", ".join(changed))  # fmt: skip
        resumed_at = state.epochs_done
        if args.evaluate:  # a checkpoint's metrics on the validation set, by this job's processes; nothing trained
            with ema.swapped(args.weights == "ema"):  # (--weights raw: the trained weights)
                _evaluate(model, val_loader, env, task, amp_dtype, checkpoints.loaded or args.init_from, output_dir)
            return
        engine.check_task(model, val_loader, env, task, amp_dtype)  # metrics() on two batches: its mistakes now
        args.grad_accum = state.plan_batches(args.batch_size, env.world_size, args.grad_accum, args.global_batch_size)
        state.switch_precision(amp_dtype)
        workers = train_loader.num_workers
        global_batch = logs.log_job(
            env, args.batch_size, args.grad_accum, len(train_set), len(val_set), workers, amp_dtype
        )
        logs.log_model(args.strategy, *engine.training_memory(model, trained.optimizer))
        watch = LoaderWatch.of(train_loader, env)  # the wait for batches, and a hint when more workers help
        metrics = logs.MetricsLog(
            output_dir / "metrics.jsonl", env.is_main, args.epochs, state.epochs_done,
            world_size=env.world_size, global_batch_size=global_batch,
        )  # fmt: skip
        # OUTPUT_DIR/config.yaml: the options, read back by --config to repeat the run; and the tracker's run.
        # (--lr: the one the run's rate comes from, the checkpoint's where not given; a start that saved nothing aside)
        given, resumed = {**options.of_run(args), "lr": state.given_lr}, checkpoints.loaded is not None
        trains = state.epochs_done < args.epochs
        changed = options.record(given, output_dir, env.is_main, resumed, trains)  # (a resumed run's are said)
        tracker = trackers.open_tracker(
            args.tracking, output_dir, env, state, len(train_loader), args.grad_accum, args.batch_size, given, changed,
            resumed, args.folds_dir,
        )  # fmt: skip
        if not trains:
            log.info(
                "nothing to train: the checkpoint is at epoch %d and --epochs is %d", state.epochs_done, args.epochs
            )
        try:
            fit.run_epochs(
                trained, train_loader, val_loader, env, state, stop, task, args, checkpoints, tracker, metrics, watch
            )
            checkpoints.wait_for_save()
            folds.predict_out_of_fold(
                args, checkpoints, model, val_loader, val_set, env, task, amp_dtype, state.epochs_done > resumed_at
            )
            tracker.best(newest(checkpoints.directory, BEST))
        except preemption.Stopped as stopped:  # mid-epoch or at an epoch's end: save, then leave
            checkpoints.save_stopped(stopped)
            checkpoints.wait_for_save()
            preemption.leave(stopped, checkpoints.last_path)
        finally:
            tracker.close()
        last = checkpoints.last_path.parent.resolve() / checkpoints.last_path.name  # a sharded save's link, kept
        log.info("done: best %s; checkpoint: %s", logs.best_of(state), last)
        # Leave together: a rank that tears down the process group while a peer is still talking to it can abort.
        distributed.barrier()
    finally:
        output_folder.release(lock)


def _evaluate(model, val_loader, env, task: seam.Task, amp_dtype: str | None, checkpoint, output_dir: Path) -> None:
    if checkpoint is None:
        _no_checkpoint(output_dir, env)
    logs.report_evaluation(
        output_dir, engine.evaluate(model, val_loader, env, task, amp_dtype), env.is_main, checkpoint
    )
    distributed.barrier()


def _no_checkpoint(output_dir: Path, env) -> None:
    raise UserError(
        f"--evaluate: no checkpoint in {output_dir / 'checkpoints'}: pass --resume PATH (a last.* or best.*) "
        "or --init-from PATH",
        shown=env.local_rank == 0,
    )
