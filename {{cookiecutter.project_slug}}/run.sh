#!/usr/bin/env bash
# Start training with {{ cookiecutter.launcher }}; every argument goes to run.py (see README.md).
# Where it runs (SLURM, Kubernetes, ModelArts, AI Studio, or this machine alone) is read from the environment
# by {{ cookiecutter.project_slug }}/platforms.py, and the first line printed says what was found.
# Optional environment; each one overrides just its own value:
#   NPROC_PER_NODE  processes on this machine (default: the platform's figure, else the visible GPUs, else 1)
{%- if cookiecutter.nodes == "multi" %}
#   NNODES          machines in the job (default 1); set, it turns the platform detection off
#   NODE_RANK       this machine's index, 0 .. NNODES-1 (default 0)
#   MASTER_ADDR     address or host name of machine 0, reachable from all (default 127.0.0.1)
#   MASTER_PORT     a free port on machine 0, the same everywhere (default 29500)
{%- if cookiecutter.launcher == "spawn" %}
#   JOIN_TIMEOUT    seconds to wait at start for the master's host name to resolve (default 900; the wait
#                   for the other machines is run.py's --dist-timeout)
{%- else %}
#   JOIN_TIMEOUT    seconds to wait at start for the other machines, and for the master's host name to
#                   resolve, before giving up (default 900)
{%- endif %}
{%- if (cookiecutter.framework == "pytorch" and cookiecutter.launcher == "torchrun") or (cookiecutter.framework == "paddle" and cookiecutter.launcher != "spawn") %}
#   NNODES=MIN:MAX  an elastic job: it goes on from the last save when machines are lost, down to MIN{{ ", meeting in etcd" if cookiecutter.framework == "paddle" }}
{%- if cookiecutter.framework == "paddle" %}
#   ETCD_ENDPOINT   HOST:PORT of the etcd server an elastic job meets in (pip install etcd3)
{%- endif %}
#   JOB_ID          an elastic job's name, the same on every machine (default: the package's and MASTER_PORT)
#   MAX_RESTARTS    an elastic job's restarts after a failure or a lost machine before it gives up (default 3)
{%- endif %}
{%- else %}
#   MASTER_PORT     (default: a free port is picked)
{%- endif %}
#   DRY_RUN=1       print what was found and the command that would start, and start nothing
set -euo pipefail
cd "$(dirname "$0")"
export RUN_SCRIPT=${RUN_SCRIPT:-run.py} # the script each process runs: predict.sh starts predict.py this way
# python3: bare GPU server images have no `python`; a venv or conda environment first on the PATH has both.
PYTHON=$(command -v python3 || command -v python) || {
  echo "error: neither python3 nor python is on the PATH: install Python 3, or activate its environment" >&2
  exit 1
}

# The platform's word and the variables above give NNODES, NODE_RANK (unset where the master numbers the
# machines), NPROC_PER_NODE, MASTER_ADDR (an IP address: a host name is resolved, and waited for),
# MASTER_PORT (unset: a free one), OUTPUT_DIR (run.py's output folder, decided where run.py decides it)
# and the line `found`; or one error line, and exit status 1 (2 for a bad argument, which stops here too).
found=""
layout=$("$PYTHON" -m {{ cookiecutter.project_slug }}.platforms "$@") || exit
eval "$layout"
echo "$found"
if [[ -n ${checked:-} ]]; then
  echo "$checked"
fi
{%- if cookiecutter.nodes == "multi" %}
{%- if cookiecutter.launcher != "spawn" %}
JOIN_TIMEOUT=${JOIN_TIMEOUT:-900}
{%- endif %}
# Machine 0 hosts the rendezvous on MASTER_PORT: a busy port would fail late, or make it wait forever.
if ((NNODES > 1)) && [[ ${NODE_RANK:-} == 0 ]] && (: <"/dev/tcp/$MASTER_ADDR/$MASTER_PORT") 2>/dev/null; then
  echo "error: MASTER_PORT $MASTER_PORT on $MASTER_ADDR is in use: pick a free one, the same on every machine" >&2
  exit 1
elif ((NNODES > 1)) && [[ ${NODE_RANK:-} == 0 && -n ${checked:-} ]]; then
  echo "check port: $MASTER_PORT is free on this machine, the master"
fi
{%- endif %}
# From here on the layout is run.sh's alone. What a platform set would override it: paddle's launcher prefers
# PADDLE_* to its flags, torchrun PET_* to its defaults, and run.py would take SLURM_NTASKS, or a pod's RANK and
# WORLD_SIZE, to mean that it is one rank of the job rather than the starter of this machine's processes.
unset "${!PET_@}" PADDLE_MASTER PADDLE_NNODES PADDLE_RANK PADDLE_NPROC_PER_NODE PADDLE_TRAINER_ID PADDLE_TRAINERS_NUM \
  PADDLE_TRAINER_ENDPOINTS PADDLE_CURRENT_ENDPOINT PADDLE_TRAINERS SLURM_NTASKS SLURM_NPROCS RANK WORLD_SIZE LOCAL_RANK
export STARTED_BY_RUN_SH=1 # run.py: the machine's layout is decided (ModelArts's --init_method has no more to say)
# Share the CPU cores among this machine's processes rather than oversubscribe them.
cores=$(nproc)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / NPROC_PER_NODE > 0 ? cores / NPROC_PER_NODE : 1))}
{% if cookiecutter.framework == "pytorch" and cookiecutter.launcher != "spawn" %}
# {{ cookiecutter.project_slug }}/launcher.py runs {{ "torchrun" if cookiecutter.launcher == "torchrun" else "torch.distributed.launch" }} itself, and ends a failed job with one line.
{%- endif %}
{%- if cookiecutter.launcher == "torchrun" %}
command=("$PYTHON" -m {{ cookiecutter.project_slug }}.launcher --standalone --nproc_per_node="$NPROC_PER_NODE" "$RUN_SCRIPT" "$@")
{%- if cookiecutter.nodes == "multi" %}
if [[ -n ${MIN_NNODES:-} ]]; then
  # An elastic job: machine 0 (MASTER_ADDR) hosts the rendezvous, which numbers the machines at every restart. A
  # machine that comes back can join only when each restart gets a store of its own, not the agent's.
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 ELASTIC_JOB_ID
  command=("$PYTHON" -m {{ cookiecutter.project_slug }}.launcher --nnodes="$MIN_NNODES:$NNODES"
    --nproc_per_node="$NPROC_PER_NODE" --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"
    --rdzv-id="$ELASTIC_JOB_ID" --rdzv-conf="join_timeout=$JOIN_TIMEOUT,last_call_timeout=5"
    --max-restarts="${MAX_RESTARTS:-3}" "$RUN_SCRIPT" "$@")
elif ((NNODES > 1)); then
  command=("$PYTHON" -m {{ cookiecutter.project_slug }}.launcher --nnodes="$NNODES" --node_rank="$NODE_RANK"
    --nproc_per_node="$NPROC_PER_NODE" --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT"
    --rdzv-conf timeout="$JOIN_TIMEOUT" "$RUN_SCRIPT" "$@")
fi
{%- endif %}
{%- elif cookiecutter.launcher == "launch" and cookiecutter.framework == "pytorch" %}
command=("$PYTHON" -m {{ cookiecutter.project_slug }}.launcher --standalone --nproc-per-node="$NPROC_PER_NODE" "$RUN_SCRIPT" "$@")
{%- if cookiecutter.nodes == "multi" %}
if ((NNODES > 1)); then
  command=("$PYTHON" -m {{ cookiecutter.project_slug }}.launcher --nnodes="$NNODES" --node-rank="$NODE_RANK"
    --nproc-per-node="$NPROC_PER_NODE" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT"
    --rdzv-conf timeout="$JOIN_TIMEOUT" "$RUN_SCRIPT" "$@")
fi
{%- endif %}
{%- elif cookiecutter.launcher == "spawn" %}
# $RUN_SCRIPT spawns NPROC_PER_NODE processes itself.
export NPROC_PER_NODE NNODES
{%- if cookiecutter.nodes == "multi" %}
if ((NNODES > 1)); then
  export NODE_RANK MASTER_ADDR MASTER_PORT
fi
{%- endif %}
command=("$PYTHON" "$RUN_SCRIPT" "$@")
{%- elif cookiecutter.framework == "paddle" and cookiecutter.launcher in ("launch", "fleetrun") %}
# {{ cookiecutter.launcher }} starts NPROC_PER_NODE copies of run.py and writes the output of each one (local index N)
# to log_dir/workerlog.N, showing worker 0's here too. log_dir is launch-logs/ in run.py's output folder
# (launch-logs/nodeR on several machines; predict.py's and --check's: in the temporary folder, deleted at the end),
# overwritten by every run.
log_dir="$LAUNCH_LOGS"
temporary_logs=0
if [[ $LAUNCH_LOGS != "$OUTPUT_DIR/launch-logs" ]]; then
  temporary_logs=1
fi
launch_args=(--nproc_per_node "$NPROC_PER_NODE" --log_overwrite true --log_level WARNING)
# paddle picks its free ports in PORT_RANGE (35100:64000 by default), among those the kernel gives outgoing
# connections: one may take a picked port before the worker binds it, and paddle aborts in C++. Pick below those.
read -r first_outgoing _ 2>/dev/null </proc/sys/net/ipv4/ip_local_port_range || first_outgoing=32768
if ((first_outgoing > 21000)); then
  export PORT_RANGE=${PORT_RANGE:-20000:$((first_outgoing - 1))}
fi
{%- if cookiecutter.nodes == "multi" %}
if ((NNODES > 1)); then
  # (Simulating machines on one, start machine 0 first or together: there any of them may host the master.)
  log_dir+="/node${NODE_RANK:-$(hostname)}"
  if [[ -n ${MIN_NNODES:-} ]]; then
    # An elastic job: the machines meet in etcd, which numbers them again at every restart; a lost machine's
    # peers go on elastic_timeout seconds after its heartbeat stops. etcd3's generated code needs protobuf's
    # pure-Python parser.
    launch_args+=(--master "etcd://$ETCD_ENDPOINT" --nnodes "$MIN_NNODES:$NNODES" --job_id "$ELASTIC_JOB_ID"
      --elastic_level 1 --elastic_timeout 10 --max_restart "${MAX_RESTARTS:-3}")
    export ELASTIC_JOB_ID PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python
  else
    launch_args+=(--master "$MASTER_ADDR:$MASTER_PORT" --nnodes "$NNODES")
    if [[ -n ${NODE_RANK:-} ]]; then # else the master numbers the machines, its own first (a PaddleJob)
      launch_args+=(--rank "$NODE_RANK")
    fi
  fi
  export JOIN_TIMEOUT
fi
{%- endif %}
# {{ cookiecutter.project_slug }}/launcher.py runs paddle.distributed.launch{{ " (what fleetrun runs too)" if cookiecutter.launcher == "fleetrun" }} in-process{{ ", and gives up after JOIN_TIMEOUT" if cookiecutter.nodes == "multi" }}.
# paddle's import warns that ccache, used only to compile C++ extensions, is missing; run.py hides it for the workers.
command=("$PYTHON" -W "ignore:No ccache found" -m {{ cookiecutter.project_slug }}.launcher "${launch_args[@]}" --log_dir "$log_dir" "$RUN_SCRIPT" "$@")
{%- endif %}
if [[ ${DRY_RUN:-} == 1 ]]; then
  echo "would run: ${command[*]@Q}"
  exit 0
fi
{%- if cookiecutter.install_requirements == "yes" %}

# Script-task platforms start from a bare image: install once per machine, before any process starts.
echo "installing requirements.txt ..."
if ! "$PYTHON" -m pip install --quiet --disable-pip-version-check -r requirements.txt; then
  echo "error: pip install -r requirements.txt failed (see pip's message above); fix requirements.txt or the package index" >&2
  exit 1
fi
{%- endif %}
{%- if cookiecutter.framework == "paddle" and cookiecutter.launcher in ("launch", "fleetrun") %}

# The console shows worker 0's output only, and launcher.py the other workers' error lines: name the traceback of
# each other worker that failed differently.
show_worker_errors() {
  local log last first
  first=$(tail -n 1 "$1/workerlog.0" 2>/dev/null) || first=""
  for log in "$1"/workerlog.*; do
    last=$(tail -n 1 "$log" 2>/dev/null) || continue
    if [[ $log != */workerlog.0 && $last != "$first" ]] && grep -q '^Traceback' "$log"; then
      echo "$log: $last" >&2
    fi
  done
}

# paddle writes its copies of the whole environment (access tokens too) there while the job runs: this user's only.
if ! said=$(mkdir -p "$log_dir" 2>&1 && chmod 700 "$log_dir" 2>&1); then # (before paddle's launcher fails there)
  if ((temporary_logs)); then
    echo "error: the launcher's log folder $log_dir cannot be made (${said##*: }): set TMPDIR to one you may write" >&2
  else
    [[ -f $OUTPUT_DIR ]] && said="it is a file"
    echo "error: the output folder $OUTPUT_DIR cannot be written (${said##*: }): give --output-dir one you may write" >&2
  fi
  exit 1
fi
rm -f "$log_dir"/workerlog.* # launcher.py takes a new workerlog.0 as the sign that every machine joined
"${command[@]}" &
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
if ((!stopped && status != 0)); then
  show_worker_errors "$log_dir"
fi
# paddle's copies of the whole environment (access tokens too; the pod's *.log starts with one): not left in
# outputs that get shared. (backup_env.N.json stays: the workers of a job started next, waiting for this one's
# output folder, read theirs as they start.)
rm -f "$log_dir"/envlog.* "$log_dir"/*.log
if ((temporary_logs)); then # what its workers said is on the console (the parent: once every machine's is gone)
  rm -rf "$log_dir"
  rmdir "$LAUNCH_LOGS" 2>/dev/null || true
fi
if ((stopped)); then
  exit 143 # as the workers do: stopped by SIGTERM, the checkpoint saved
fi
exit "$status"
{%- else %}
exec "${command[@]}"
{%- endif %}
