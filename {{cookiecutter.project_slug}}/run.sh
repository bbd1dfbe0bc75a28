#!/usr/bin/env bash
# Start training with {{ cookiecutter.launcher }}; every argument goes to run.py (see README.md).
# Optional environment:
#   NPROC_PER_NODE  processes on this machine (default: the visible GPUs, or 1)
{%- if cookiecutter.nodes == "multi" %}
#   NNODES          machines in the job (default 1)
#   NODE_RANK       this machine's index, 0 .. NNODES-1 (default 0)
#   MASTER_ADDR     address of machine 0, reachable from all (default 127.0.0.1)
#   MASTER_PORT     a free port on machine 0, the same everywhere (default 29500)
{%- else %}
#   MASTER_PORT     (default: a free port is picked)
{%- endif %}
set -euo pipefail
cd "$(dirname "$0")"

count_gpus() {
  if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    awk -F, '{ print ($0 == "" ? 0 : NF) }' <<<"$CUDA_VISIBLE_DEVICES"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true
  else
    echo 0
  fi
}

gpus=$(count_gpus)
NPROC_PER_NODE=${NPROC_PER_NODE:-$((gpus > 0 ? gpus : 1))}
NNODES=${NNODES:-1}
{%- if cookiecutter.nodes == "multi" %}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
{%- else %}
if ((NNODES != 1)); then
  echo "error: this project was baked for one machine (nodes=single); bake it again with nodes=multi to use NNODES=$NNODES" >&2
  exit 1
fi
{%- endif %}
# Share the CPU cores among this machine's processes rather than oversubscribe them.
cores=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / NPROC_PER_NODE > 0 ? cores / NPROC_PER_NODE : 1))}
{%- if cookiecutter.install_requirements == "yes" %}

# Script-task platforms start from a bare image: install once per machine, before any process starts.
echo "installing requirements.txt ..."
if ! python -m pip install --quiet --disable-pip-version-check -r requirements.txt; then
  echo "error: pip install -r requirements.txt failed (see pip's message above); fix requirements.txt or the package index" >&2
  exit 1
fi
{%- endif %}
{% if cookiecutter.launcher == "torchrun" %}
{%- if cookiecutter.nodes == "multi" %}
if ((NNODES > 1)); then
  exec torchrun --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" \
    --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" run.py "$@"
fi
{%- endif %}
exec torchrun --standalone --nproc_per_node="$NPROC_PER_NODE" run.py "$@"
{%- elif cookiecutter.launcher == "launch" and cookiecutter.framework == "pytorch" %}
# torch.distributed.launch is deprecated upstream but still what some platforms run; hide its notice.
{%- if cookiecutter.nodes == "multi" %}
if ((NNODES > 1)); then
  exec python -W ignore::FutureWarning -m torch.distributed.launch --nnodes="$NNODES" --node-rank="$NODE_RANK" \
    --nproc-per-node="$NPROC_PER_NODE" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" run.py "$@"
fi
{%- endif %}
exec python -W ignore::FutureWarning -m torch.distributed.launch --standalone --nproc-per-node="$NPROC_PER_NODE" run.py "$@"
{%- elif cookiecutter.launcher == "spawn" %}
# run.py spawns NPROC_PER_NODE processes itself.
export NPROC_PER_NODE NNODES
{%- if cookiecutter.nodes == "multi" %}
export NODE_RANK MASTER_ADDR MASTER_PORT
{%- endif %}
exec python run.py "$@"
{%- endif %}
