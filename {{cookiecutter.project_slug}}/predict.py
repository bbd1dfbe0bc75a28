"""Predict with a checkpoint of this project: every input of a file, a folder or an archive, in the task's form.

python predict.py --checkpoint output/checkpoints/best.{{ "pt" if cookiecutter.framework == "pytorch" else "pdparams" }} --input test.zip --output submission.csv
NPROC_PER_NODE=2 bash predict.sh ...    the same, on this machine's processes: each input is predicted once

What an input is, a prediction, and the file written: data.build_predict_set() and task.py.
"""

from functools import partial

from {{ cookiecutter.project_slug }}.errors import UserError, ended_quietly_by_ctrl_c, explain_user_errors, os_words

with ended_quietly_by_ctrl_c():  # while the framework loads
    import numpy as np

    from {{ cookiecutter.project_slug }} import cli, distributed, folds, inference, loaders, logs, seam, submission
    from {{ cookiecutter.project_slug }}.workspace import PROJECT_ROOT


@explain_user_errors
def predict(args) -> None:
    env = distributed.setup(args.device, args.dist_timeout)
    given = args.checkpoint or [inference.checkpoint_path(PROJECT_ROOT / "output", "best")]
    extracted = None
    try:
        checkpoints = folds.checkpoints_of(given, lambda run: inference.checkpoint_path(run, "best"))
        # Before anything is read or written: --output may replace none of it.
        submission.check_apart(args.input, args.output, submission.read_besides(args, checkpoints))
        log = logs.setup_logging(None, env.rank)
        task = seam.Task()  # the three files a user owns, the one way to them
        averaged = len(checkpoints) > 1 or args.tta  # an ensemble, or test-time views: outputs averaged
        if averaged:
            task.check_averaging(len(checkpoints), args.tta)
        source, extracted = submission.input_path(args.input, args.archive_max_gb, env.local_rank, env.rank)
        if extracted is not None:  # every process past the extraction before any may end, leaving it (finally)
            distributed.barrier("every process's extraction of --input")
        total, description = None, None
        for checkpoint in checkpoints:
            # One read of the checkpoint: the model, and what predicting needs (the outputs' names, how inputs were
            # read: each model of an ensemble reads the inputs as its own training did).
            # (--weights raw: the trained weights of a run of --ema, not their average)
            model, own = inference.load_with_data(checkpoint, env.device, task=task, averaged=args.weights == "ema")
            description = description or own
            if own.get("num_classes") != description.get("num_classes"):
                raise UserError(
                    f"{checkpoint} has {own.get('num_classes')} outputs, {checkpoints[0]} "
                    f"{description.get('num_classes')}: an ensemble averages models of one task and one output size"
                )
            inputs, keys = task.predict_set(source, own)
            if not averaged:
                rows = per_input(inputs, args, env, partial(inference.predict, model, task=task))
                break
            outputs = np.stack(
                per_input(inputs, args, env, partial(inference.averaged_outputs, model, task=task, tta=args.tta))
            )
            if total is not None and outputs.shape != total.shape:
                raise UserError(
                    f"{checkpoint} gives outputs of {list(outputs.shape[1:])} an input, {checkpoints[0]} of "
                    f"{list(total.shape[1:])}: an ensemble averages outputs of one size"
                )
            total = outputs if total is None else total + outputs  # (in float64, in --checkpoint's order)
        if averaged:
            rows = task.rows_from_outputs(total / len(checkpoints))

        problem = None
        if env.is_main:
            try:
                written = task.write_predictions(args.output, keys, rows, description, args)
                used = checkpoints[0] if len(checkpoints) == 1 else f"an ensemble of {len(checkpoints)} checkpoints"
                log.info("predicted %d inputs of %s with %s%s: %s", len(keys), args.input, used,
                         " and test-time views" if args.tta else "", written)  # fmt: skip
            except UserError as error:  # a bad --output or --sample-submission: every process ends with its line
                problem = str(error)
            except OSError as error:  # no such folder, no permission, a full disk: not task.py's mistake
                where = f"--output {args.output}" if args.output else "the predictions"
                problem = f"{where} cannot be written ({os_words(error)})"
        problem = distributed.share_from_main(problem, "rank 0's predictions")  # every process is done with inputs
        if problem:
            raise UserError(problem, shown=env.local_rank == 0)
    finally:
        submission.leave_input(extracted, env.rank)  # (each machine extracted its own; on an error too)
        distributed.cleanup()


def per_input(inputs, args, env, on_batch) -> list:
    """on_batch(batch)'s results, one per input, in the inputs' order: whole batches dealt to the processes (each
    input's batch, so its result, is the same on any number), gathered on every process."""
    loader = loaders.predict_loader(inputs, args.batch_size, args.workers, env)
    mine, problem = [], None
    try:
        batches = logs.progress_bar(loader, env.is_main, "predict")
        for number, batch in zip(loader.batch_sampler.numbers, batches, strict=True):
            mine += zip(loader.batch_sampler.indices(number), on_batch(batch), strict=True)
    except UserError as error:  # (an input of this process's that cannot be read): raised after the gather
        problem = error  # a process that ended here would leave the others waiting in the gather
    gathered = distributed.all_gather_object((mine, str(problem) if problem else None))
    if problem:
        raise problem  # (with the user's frames where task.py raised it)
    others = next((error for _, error in gathered if error), None)
    if others:  # another process's error, said by it
        raise UserError(others, shown=False)
    parts = (part for rank_parts, _ in gathered for part in rank_parts)
    return [result for _, result in sorted(parts, key=lambda part: part[0])]


if __name__ == "__main__":
    distributed.launch(predict, cli.parse_predict_args())
