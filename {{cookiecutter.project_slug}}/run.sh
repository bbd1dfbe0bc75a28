#!/usr/bin/env bash
# Start training with {{ cookiecutter.launcher }}; every argument goes to run.py (see README.md).
# Optional environment:
#   NPROC_PER_NODE  processes on this machine (default: the visible GPUs, or 1)
{%- if cookiecutter.nodes == "multi" %}
#   NNODES          machines in the job (default 1)
#   NODE_RANK       this machine's index, 0 .. NNODES-1 (default 0)
#   MASTER_ADDR     address of machine 0, reachable from all (default 127.0.0.1)
#   MASTER_PORT     a free port on machine 0, the same everywhere (default 29500)
{%- if cookiecutter.launcher != "spawn" %}
#   JOIN_TIMEOUT    seconds the machines wait for each other at start before giving up (default 900)
{%- endif %}
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
{%- if cookiecutter.launcher != "spawn" %}
JOIN_TIMEOUT=${JOIN_TIMEOUT:-900}
{%- endif %}
# Machine 0 hosts the rendezvous on MASTER_PORT: a busy port would fail late, or make it wait forever.
if ((NNODES > 1 && NODE_RANK == 0)) && (: <"/dev/tcp/$MASTER_ADDR/$MASTER_PORT") 2>/dev/null; then
  echo "error: MASTER_PORT $MASTER_PORT on $MASTER_ADDR is in use: pick a free one, the same on every machine" >&2
  exit 1
fi
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
{% if cookiecutter.framework == "pytorch" and cookiecutter.launcher != "spawn" %}
# {{ cookiecutter.project_slug }}/launcher.py runs {{ "torchrun" if cookiecutter.launcher == "torchrun" else "torch.distributed.launch" }} itself, and ends a failed job with one line.
{%- endif %}
{%- if cookiecutter.launcher == "torchrun" %}
{%- if cookiecutter.nodes == "multi" %}
if ((NNODES > 1)); then
  exec python -m {{ cookiecutter.project_slug }}.launcher --nnodes="$NNODES" --node_rank="$NODE_RANK" --nproc_per_node="$NPROC_PER_NODE" \
    --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" --rdzv-conf timeout="$JOIN_TIMEOUT" run.py "$@"
fi
{%- endif %}
exec python -m {{ cookiecutter.project_slug }}.launcher --standalone --nproc_per_node="$NPROC_PER_NODE" run.py "$@"
{%- elif cookiecutter.launcher == "launch" and cookiecutter.framework == "pytorch" %}
{%- if cookiecutter.nodes == "multi" %}
if ((NNODES > 1)); then
  exec python -m {{ cookiecutter.project_slug }}.launcher --nnodes="$NNODES" --node-rank="$NODE_RANK" \
    --nproc-per-node="$NPROC_PER_NODE" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" \
    --rdzv-conf timeout="$JOIN_TIMEOUT" run.py "$@"
fi
{%- endif %}
exec python -m {{ cookiecutter.project_slug }}.launcher --standalone --nproc-per-node="$NPROC_PER_NODE" run.py "$@"
{%- elif cookiecutter.launcher == "spawn" %}
# run.py spawns NPROC_PER_NODE processes itself.
export NPROC_PER_NODE NNODES
{%- if cookiecutter.nodes == "multi" %}
if ((NNODES > 1)); then
  export NODE_RANK MASTER_ADDR MASTER_PORT
fi
{%- endif %}
exec python run.py "$@"
{%- elif cookiecutter.framework == "paddle" and cookiecutter.launcher in ("launch", "fleetrun") %}
# {{ cookiecutter.launcher }} starts NPROC_PER_NODE copies of run.py and writes the output of each one (local index N)
# to log_dir/workerlog.N, showing worker 0's here too. log_dir is launch-logs/ in run.py's --output-dir
# (launch-logs/nodeR on several machines), overwritten by every run.
output_dir_of() {
  local dir=output
  while (($# > 0)); do
    case $1 in
      --output-dir=*) dir=${1#*=} ;;
      --output-dir) dir=${2:-$dir} ;;
    esac
    shift
  done
  echo "$dir"
}

# The console shows worker 0's output only: name the error of each other worker that failed differently.
show_worker_errors() {
  local log last first
  first=$(tail -n 1 "$1/workerlog.0" 2>/dev/null) || first=""
  for log in "$1"/workerlog.*; do
    last=$(tail -n 1 "$log" 2>/dev/null) || continue
    if [[ $log != */workerlog.0 && $last != "$first" ]] && grep -qE '^(error: |Traceback)' "$log"; then
      echo "$log: $last" >&2
    fi
  done
}

log_dir="$(output_dir_of "$@")/launch-logs"
launch_args=(--nproc_per_node "$NPROC_PER_NODE" --log_overwrite true --log_level WARNING)
{%- if cookiecutter.nodes == "multi" %}
if ((NNODES > 1)); then
  # (Simulating machines on one, start machine 0 first or together: there any of them may host the master.)
  log_dir+="/node$NODE_RANK"
  launch_args+=(--master "$MASTER_ADDR:$MASTER_PORT" --nnodes "$NNODES" --rank "$NODE_RANK")
  export JOIN_TIMEOUT
fi
{%- endif %}
rm -f "$log_dir"/workerlog.* # launcher.py takes a new workerlog.0 as the sign that every machine joined
# {{ cookiecutter.project_slug }}/launcher.py runs paddle.distributed.launch{{ " (what fleetrun runs too)" if cookiecutter.launcher == "fleetrun" }} in-process{{ ", and gives up after JOIN_TIMEOUT" if cookiecutter.nodes == "multi" }}.
# paddle's import warns that ccache, used only to compile C++ extensions, is missing; run.py hides it for the workers.
python -W "ignore:No ccache found" -m {{ cookiecutter.project_slug }}.launcher "${launch_args[@]}" --log_dir "$log_dir" run.py "$@" &
launcher=$!
# Kubernetes sends SIGTERM to this script only: pass it on, so that the workers save and stop.
stopped=0
trap 'stopped=1; kill -TERM "$launcher" 2>/dev/null || true' TERM INT
status=0
wait "$launcher" || status=$?
while kill -0 "$launcher" 2>/dev/null; do # the trap interrupted wait: wait for the launcher itself
  status=0
  wait "$launcher" || status=$?
done
if ((stopped)); then
  exit 143 # as the workers do: stopped by SIGTERM, the checkpoint saved
fi
if ((status != 0)); then
  show_worker_errors "$log_dir"
fi
exit "$status"
{%- endif %}
