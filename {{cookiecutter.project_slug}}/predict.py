"""Predict with a checkpoint of this project: every input of a file, a folder or an archive, in the task's form.

python predict.py --checkpoint output/checkpoints/best.{{ "pt" if cookiecutter.framework == "pytorch" else "pdparams" }} --input test.zip --output submission.csv
NPROC_PER_NODE=2 bash predict.sh ...    the same, on this machine's processes: each input is predicted once

What an input is, a prediction, and the file written: data.build_predict_set() and task.py.
"""

import shutil

from {{ cookiecutter.project_slug }} import cli, distributed, inference, loaders, logs, seam, submission
from {{ cookiecutter.project_slug }}.errors import UserError, explain_user_errors
from {{ cookiecutter.project_slug }}.workspace import PROJECT_ROOT


@explain_user_errors
def predict(args) -> None:
    env = distributed.setup(args.device, args.dist_timeout)
    args.checkpoint = args.checkpoint or inference.checkpoint_path(PROJECT_ROOT / "output", "best")
    try:
        log = logs.setup_logging(None, env.rank)
        task = seam.Task()  # the three files a user owns, the one way to them
        # One read of the checkpoint: the model, and what predicting needs (the outputs' names, how inputs were read).
        averaged = args.weights == "ema"  # (--weights raw: the trained weights of a run of --ema, not their average)
        model, description = inference.load_with_data(args.checkpoint, env.device, task=task, averaged=averaged)
        source, extracted = submission.input_path(args.input, args.archive_max_gb, env.local_rank)
        inputs, keys = task.predict_set(source, description)

        # Whole batches dealt to the processes: each input's batch, so its prediction, is the same on any number.
        loader = loaders.predict_loader(inputs, args.batch_size, args.workers, env)
        mine = []
        batches = logs.progress_bar(loader, env.is_main, "predict")
        for number, batch in zip(loader.batch_sampler.numbers, batches, strict=True):
            mine += zip(loader.batch_sampler.indices(number), inference.predict(model, batch, task), strict=True)
        gathered = (part for rank in distributed.all_gather_object(mine) for part in rank)
        rows = [row for _, row in sorted(gathered, key=lambda part: part[0])]

        problem = None
        if env.is_main:
            try:
                written = task.write_predictions(args.output, keys, rows, description, args)
                log.info("predicted %d inputs of %s with %s: %s", len(keys), args.input, args.checkpoint, written)
            except UserError as error:  # a bad --output or --sample-submission: every process ends with its line
                problem = str(error)
        problem = distributed.share_from_main(problem, "rank 0's predictions")  # every process is done with inputs
        if problem:
            raise UserError(problem, shown=env.local_rank == 0)
        if extracted is not None and env.is_main:
            shutil.rmtree(extracted, ignore_errors=True)
    finally:
        distributed.cleanup()


if __name__ == "__main__":
    distributed.launch(predict, cli.parse_predict_args())
