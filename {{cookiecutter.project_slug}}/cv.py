"""The cross-validation score of a run of --folds K (run.py --folds K --fold all prints it at its end too).

python cv.py OUTPUT_DIR

Writes OUTPUT_DIR/oof.csv (every labeled sample's out-of-fold prediction: the folds' oof.csv rows together) and
OUTPUT_DIR/cv.json (task.py's metrics over every fold's validation pooled, as one validation over all the labeled
data: oof_<name>; each fold's best metric, their mean and standard deviation), and prints the cv: line.
"""

from {{ cookiecutter.project_slug }} import cli, folds, seam
from {{ cookiecutter.project_slug }}.errors import UserError


def parse_args():
    parser = cli.OneLineParser(prog="cv.py", description="The cross-validation score of a run of --folds K.")
    parser.add_argument("output_dir", help="the --output-dir of the run of --folds K (it holds folds.csv, fold-*/)")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    try:
        print(folds.cross_validate(args.output_dir, seam.Task()))
    except UserError as error:
        raise SystemExit(f"error: {error}") from None
