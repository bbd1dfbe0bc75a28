#!/usr/bin/env bash
# Predict on this machine's processes, started the way run.sh starts training; every argument goes to
# predict.py (python predict.py --help):
#   bash predict.sh --checkpoint output/checkpoints/best.{{ "pt" if cookiecutter.framework == "pytorch" else "pdparams" }} --input test.zip --output submission.csv
# NPROC_PER_NODE, MASTER_PORT and DRY_RUN mean what they mean to run.sh; it is always one machine.
cd "$(dirname "$0")" || exit
RUN_SCRIPT=predict.py NNODES=1 NNODES_SOURCE="predict.sh: this machine" exec bash run.sh "$@"
