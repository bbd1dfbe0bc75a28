"""Write a checkpoint's model as one plain file, for use outside this project.

python export.py output/checkpoints/best{{ ".pt" if cookiecutter.framework == "pytorch" else ".pdparams" }} model{{ ".pt" if cookiecutter.framework == "pytorch" else ".pdparams" }}

CHECKPOINT: any save run.py wrote (best or last; a file, or the folder of a sharded run's save, which it reads
whole); with --weights raw the trained weights of a run of --ema rather than their average. OUTPUT: {% if cookiecutter.framework == "pytorch" %}torch.load(OUTPUT, weights_only=True)["model"] is the plain model's state dict{% else %}paddle.load(OUTPUT) is the plain model's state dict{% endif %}.
"""

from pathlib import Path

from {{ cookiecutter.project_slug }} import checkpoint, cli
from {{ cookiecutter.project_slug }}.errors import UserError, os_words


def parse_args():
    parser = cli.OneLineParser(
        prog="export.py",
        description="Write the model weights of a checkpoint (a file, or a sharded save's folder) as one plain file.",
    )
    parser.add_argument("checkpoint", help="a save run.py wrote: OUTPUT_DIR/checkpoints/best.*, last.*, best, last")
    parser.add_argument("output", help="the file to write: the model's state dict alone")
    cli.add_weights_flag(parser, "exporting")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    source, target = Path(args.checkpoint).resolve(), Path(args.output).resolve()
    if target == source or source in target.parents:  # (a sharded save is a folder)
        raise SystemExit(f"error: {args.output} is the checkpoint read: writing there would replace it; name another")
    if Path(args.output).is_dir():
        raise SystemExit(f"error: {args.output} is a folder: name the file to write in it")
    try:
        written = checkpoint.export_weights(Path(args.checkpoint), Path(args.output), args.weights == "ema")
    except UserError as error:
        raise SystemExit(f"error: {error}") from None
    except OSError as error:  # no such folder, no permission, ... (the checkpoint's own problems are UserErrors)
        raise SystemExit(f"error: {args.output} cannot be written ({os_words(error)})") from None
    print(f"exported the model of {args.checkpoint}: {written}")
