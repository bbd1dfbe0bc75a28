"""Predict the class of every image in a folder or an archive with a checkpoint of this project: a CSV to submit.

python predict.py --checkpoint output/checkpoints/best.{{ "pt" if cookiecutter.framework == "pytorch" else "pdparams" }} --input test.zip --output submission.csv
NPROC_PER_NODE=2 bash predict.sh ...    the same, on this machine's processes: each image is predicted once
"""

import shutil

from {{ cookiecutter.project_slug }} import cli, distributed, inference, loaders, logs, submission
from {{ cookiecutter.project_slug }}.errors import explain_user_errors


@explain_user_errors
def predict(args) -> None:
    env = distributed.setup(args.device, args.dist_timeout)
    try:
        log = logs.setup_logging(None, env.rank)
        # One read of the checkpoint: the model, and the class names and how training read images.
        model, description = inference.load_with_data(args.checkpoint, env.device)
        root, extracted = submission.input_folder(args.input, args.archive_max_gb, env.local_rank)
        names = submission.image_names(root)

        mine = []
        batches = submission.my_batches(len(names), args.batch_size, env.rank, env.world_size)
        # The loader cuts this process's images into the same batches: all but the very last batch are full.
        paths = [root / names[index] for batch in batches for index in batch]
        read = submission.image_reader(description)
        loader = loaders.image_loader(paths, read, args.batch_size, args.workers, env)
        for batch, images in zip(batches, logs.progress_bar(loader, env.is_main, "predict"), strict=True):
            probabilities = inference.probabilities(model, images)
            mine += [(index, int(p.argmax()), float(p.max())) for index, p in zip(batch, probabilities, strict=True)]
        predictions = sorted(prediction for rank in distributed.all_gather_object(mine) for prediction in rank)

        if env.is_main:
            classes = description.get("classes")  # none in a bare state dict: the class indices then
            labels = [classes[label] if classes else str(label) for _, label, _ in predictions]
            chances = [chance for _, _, chance in predictions] if args.probabilities else None
            submission.write(args.output, names, labels, chances, args.sample_submission)
            log.info("predicted %d images of %s with %s: %s", len(names), args.input, args.checkpoint, args.output)
        distributed.barrier()  # every process is done with the images
        if extracted is not None and env.is_main:
            shutil.rmtree(extracted, ignore_errors=True)
    finally:
        distributed.cleanup()


if __name__ == "__main__":
    distributed.launch(predict, cli.parse_predict_args())
