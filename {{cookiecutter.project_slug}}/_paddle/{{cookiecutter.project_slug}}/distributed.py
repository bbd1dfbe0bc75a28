"""Everything that makes one training script run as many processes.

Who this process is comes from the launcher's environment
(python -m paddle.distributed.launch, fleetrun, paddle.distributed.spawn and platforms
such as PaddleCloud or AI Studio set PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM,
PADDLE_TRAINER_ENDPOINTS, ...). With none set, this is rank 0 of 1 and
nothing here does any communication: single process is just the default case.

With the fleetrun launcher the own loop also uses paddle's fleet API: fleet.init()
takes a DistributedStrategy that says how fleet.distributed_model() wraps the
model, so it runs in wrap_model(), where the model's needs
(--find-unused-parameters) are known; setup() has joined the process group by then.
"""

import contextlib
import io
import itertools
import logging
import os
import pickle
import signal
import socket
import sys
import time
import warnings

import paddle
import paddle.distributed as dist
from paddle.base import core
from paddle.distributed import fleet

from . import errors, framework_probe, hardware, sharding
from .errors import COLLECTIVE_TIMEOUT_STATUS, STOPPED_STATUS, UserError
from .hardware import DistEnv
from .roll_call import die_with_parent
from .settings import LAUNCHER

_log = logging.getLogger(__name__)

# Paddle's gloo collectives give up after 30 s, whatever PADDLE_PG_TIMEOUT says (paddle 3.3). The project's own
# long waits (for rank 0's save, a machine's extraction, the folder lock) go through the rendezvous store
# instead, and wait up to --dist-timeout, which setup() keeps here.
_GLOO_LIMIT_S = 30
_wait_limit_s = 1800.0
_HELD_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD}
_waits = itertools.count()  # every rank waits in the same order: the n-th wait has the same key everywhere


def read_ranks() -> tuple[int, int, int]:
    """(global rank, local rank, world size) as the launcher, or the platform, tells them."""
    env = os.environ
    rank = int(env.get("PADDLE_TRAINER_ID", 0))
    # launch sets PADDLE_LOCAL_RANK, older launchers PADDLE_RANK_IN_NODE; spawn (one machine) neither.
    local_rank = int(env.get("PADDLE_LOCAL_RANK", env.get("PADDLE_RANK_IN_NODE", rank)))
    return rank, local_rank, int(env.get("PADDLE_TRAINERS_NUM", 1))


def setup(device: str = "auto", timeout_s: float = 1800.0) -> DistEnv:
    """Pick this rank's device and join the process group (NCCL on GPU, gloo on CPU)."""
    rank, local_rank, world_size = read_ranks()
    gpus, problem = (framework_probe.gpu_count(), framework_probe.gpu_problem()) if device != "cpu" else (0, None)
    # The launcher gives each process its GPU in FLAGS_selected_gpus (what paddle's ParallelEnv reads); without
    # this every rank would use GPU 0.
    index = int(os.environ.get("FLAGS_selected_gpus", str(local_rank)).split(",")[0])
    processes = int(os.environ.get("PADDLE_LOCAL_SIZE", local_rank + 1))
    gpu = hardware.gpu_of_rank(device, index, gpus, problem, processes, warns=local_rank == 0)
    this_device = "cpu" if gpu is None else f"gpu:{gpu}"
    paddle.set_device(this_device)
    if world_size > 1:
        # paddle's launcher starts each rank in a session of its own: a launcher killed outright (kill -9 of
        # run.sh's process group, as a test or a user does) would leave its ranks training on, holding the folder.
        die_with_parent(os.getppid())
        if this_device == "cpu":
            os.environ["PADDLE_DISTRI_BACKEND"] = "gloo"  # paddle's default with CUDA is NCCL, even for CPU tensors
        os.environ["PADDLE_PG_TIMEOUT"] = str(int(timeout_s * 1000))  # NCCL collectives; gloo keeps _GLOO_LIMIT_S
        global _wait_limit_s
        _wait_limit_s = timeout_s
        store = os.environ.get("PADDLE_MASTER") or os.environ.get("PADDLE_TRAINER_ENDPOINTS", "").split(",")[0]
        if rank > 0:
            _wait_for_the_store(store, timeout_s)
        with _without_flag_table():
            dist.init_parallel_env()
        _store_without_nagle(store)
    # launch and fleetrun set PADDLE_LOCAL_SIZE; spawn starts the processes of one machine.
    return DistEnv(rank, local_rank, world_size, this_device, int(os.environ.get("PADDLE_LOCAL_SIZE", world_size)))


def _store_without_nagle(endpoint: str) -> None:
    """TCP_NODELAY on this process's connections to (and, on rank 0, from) the rendezvous store.

    Paddle's store sends a request in pieces: with Nagle's algorithm each call waited for a delayed ACK,
    44 ms per call here (0.1 ms without), and the store's waits made start-up 0.7 s longer.
    """
    port = int(endpoint.rpartition(":")[2] or 0)
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # not connected (a listening socket), or closed meanwhile
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                with socket.socket(fileno=os.dup(int(name))) as connection:
                    tcp = (
                        connection.family in (socket.AF_INET, socket.AF_INET6) and connection.type == socket.SOCK_STREAM
                    )
                    if tcp and port in (connection.getsockname()[1], connection.getpeername()[1]):
                        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _wait_for_the_store(endpoint: str, timeout_s: float) -> None:
    """Return once rank 0's rendezvous store listens (or at the timeout: joining then says what is wrong).

    Paddle's own client tries again only every 3 s: a rank that starts before rank 0 would lose them.
    """
    if ":" not in endpoint:  # nowhere to look: paddle's own client will say what is missing
        return
    host, port = endpoint.rsplit(":", 1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=1):
            return
        time.sleep(0.05)


@contextlib.contextmanager
def _without_flag_table():
    """Drop the "Modified FLAGS detected" table paddle prints to stderr at every init_parallel_env().

    It lists a flag paddle sets itself, on every start, and says nothing about this run.
    """
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            yield
    finally:
        table = ("=====", "FLAGS(")
        sys.stderr.write("".join(line for line in captured.getvalue().splitlines(True) if not line.startswith(table)))


def cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(waiting_for: str = "the other processes") -> None:
    """Return when every rank has come here, each waiting up to --dist-timeout (through the store, not gloo)."""
    if not dist.is_initialized():
        return
    if paddle.get_device().startswith("gpu"):
        paddle.device.synchronize()  # as dist.barrier() would: this rank's queued GPU work is done too
    key, world_size = _next_key(), dist.get_world_size()
    _store("add", key, 1)
    _wait_until(lambda: _store("add", key, 0) >= world_size, waiting_for)
    # Rank 0 hosts the store: it leaves last, once every rank has seen the count (or their next look would fail).
    _store("add", f"{key}.seen", 1)
    if dist.get_rank() == 0:
        _wait_until(lambda: _store("add", f"{key}.seen", 0) >= world_size, waiting_for)


def share_from_main(obj, waiting_for: str):
    """Rank 0's `obj` (small, picklable) on every rank; the others wait for it up to --dist-timeout."""
    if not dist.is_initialized():
        return obj
    key = _next_key()
    if dist.get_rank() == 0:
        _store("set", key, pickle.dumps(obj))
        _store("add", f"{key}.ready", 1)
        barrier(waiting_for)  # rank 0 hosts the store: it stays until every rank has read
        return obj
    _wait_until(lambda: _store("add", f"{key}.ready", 0) > 0, waiting_for)
    obj = pickle.loads(bytes(_store("get", key)))
    barrier(waiting_for)
    return obj


def _store(method: str, *args):
    """A call to rank 0's rendezvous store, signals held back until it returns: one landing while paddle's client
    waits for the reply (the launcher's second SIGTERM while rank 0 saves) would fail the call ("Interrupted
    system call") and leave the connection out of step. Its handler runs right after the call instead."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        return getattr(core.create_or_get_global_tcp_store(), method)(*args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _next_key() -> str:
    return f"dist_template.wait.{next(_waits)}"


def _wait_until(done, waiting_for: str) -> None:
    deadline = time.monotonic() + _wait_limit_s
    while not done():
        if time.monotonic() > deadline:
            raise UserError(
                f"waited --dist-timeout {_wait_limit_s:g} s for {waiting_for}: raise --dist-timeout if that "
                f"takes longer (paddle's own collectives on CPUs still give up after {_GLOO_LIMIT_S} s)"
            )
        time.sleep(0.01)


def all_reduce_sum(values: list[float], env: DistEnv) -> list[float]:
    """Sum a few numbers over all ranks, in one collective."""
    if env.world_size == 1:
        return list(values)
    totals = paddle.to_tensor(values, dtype="float64")
    dist.all_reduce(totals)
    return totals.tolist()


def all_gather_object(obj) -> list:
    """Every rank's `obj`, in rank order (small Python objects only)."""
    if not dist.is_initialized():
        return [obj]
    gathered = []
    dist.all_gather_object(gathered, obj)
    return gathered


def sync_batch_norm(model: paddle.nn.Layer, env: DistEnv, enabled: bool) -> paddle.nn.Layer:
    """--sync-bn: the model's batch normalisation over the global batch, where hardware.synchronises_batch_norm()
    says it can be."""
    layers = sum(isinstance(layer, paddle.nn.layer.norm._BatchNormBase) for layer in model.sublayers())
    if hardware.synchronises_batch_norm(enabled, layers, env.world_size, env.on_gpu):
        return paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def wrap_model(
    model: paddle.nn.Layer, env: DistEnv, find_unused_parameters: bool = False, compile: bool = False,
    channels_last: bool = False, strategy: str = "ddp", activation_checkpointing: bool = False, amp_dtype=None,
    units: tuple = (), reshard_after_forward: bool = True,
) -> paddle.nn.Layer:  # fmt: skip
    """The model (on this rank's device: setup() made it paddle's default), in DataParallel on several ranks.

    Under fleetrun, and for sharding stage 1 (sharding.py), fleet.init() makes its groups here and
    fleet.distributed_model() wraps; stages 2 and 3 wrap model and optimizer together in wrap_optimizer().
    --compile, --channels-last and --activation-checkpointing (with FSDP's `units`) are PyTorch's: paddle's counterparts
    (paddle.jit.to_static, a data_format per layer, recompute()) change the model itself, so the log says they
    are not applied.
    """
    _say_pytorch_only(compile, channels_last, activation_checkpointing)
    if not reshard_after_forward:
        _log.info(
            "--no-reshard-after-forward is PyTorch's fsdp: paddle's counterpart is --sharding-stage 2 (whole "
            "parameters, sharded gradients and optimizer state)"
        )
    sharding.check_device(strategy, env.on_gpu)
    if env.world_size == 1 and strategy != "ddp":
        _log.info("--strategy %s on one process: nothing to shard, the model trains whole", strategy)
    if env.world_size == 1 or sharding.stage_of(strategy) > 1:
        return model
    if not _uses_fleet(strategy):
        return paddle.DataParallel(model, find_unused_parameters=find_unused_parameters)
    quiet = "ERROR"  # not fleet's lines about its strategy, its groups and the process group setup() joined
    fleet.set_log_level(quiet)
    groups = sharding.groups_of_all_ranks_are_the_global_group(env.on_gpu, env.world_size)
    with _without_flag_table(), warnings.catch_warnings(), groups:
        # Each rank makes every group, its own and the others' (of which it is told it is no member).
        warnings.filterwarnings("ignore", "Current global rank")
        chosen = sharding.fleet_strategy(find_unused_parameters, env.world_size, strategy)
        fleet.init(is_collective=True, strategy=chosen, log_level=quiet)
    return fleet.distributed_model(model)


def _uses_fleet(strategy: str) -> bool:
    return (LAUNCHER == "fleetrun" or sharding.stage_of(strategy) == 1) and dist.is_initialized()


def _say_pytorch_only(compile: bool, channels_last: bool, recompute: bool = False) -> None:
    flags = {"--compile": compile, "--channels-last": channels_last, "--activation-checkpointing": recompute}
    for flag in [flag for flag, asked in flags.items() if asked]:
        _log.info("%s is PyTorch's (paddle's counterpart changes the model): the model runs as it is", flag)


def wrap_optimizer(model: paddle.nn.Layer, optimizer: paddle.optimizer.Optimizer, scaler, strategy: str = "ddp"):
    """(model, optimizer, scaler) as the training loop uses them: fleet's optimizer after fleet.init(), all three
    wrapped by sharding stages 2 and 3 (on one process: as they are)."""
    if sharding.stage_of(strategy) > 1 and dist.is_initialized():
        return sharding.shard_stages_2_and_3(model, optimizer, scaler, strategy)
    if not _uses_fleet(strategy):
        return model, optimizer, scaler
    with warnings.catch_warnings():  # that a CPU build has no NCCL average: sharding then sums and divides
        warnings.filterwarnings("ignore", "nccl reduce_avg")
        return model, fleet.distributed_optimizer(optimizer), scaler


def unwrap(model: paddle.nn.Layer) -> paddle.nn.Layer:
    """The user's model, without the DataParallel wrapper, or fleet's, or sharding's."""
    return model._layers if isinstance(model, paddle.DataParallel) else sharding.unwrapped(model)


def launch(worker, args) -> None:
    """Run `worker(args)` in this process, or, with the spawn launcher, in NPROC_PER_NODE children."""
    nproc = int(os.environ.get("NPROC_PER_NODE", framework_probe.gpu_count() or 1))
    if LAUNCHER != "spawn" or nproc == 1 or launched_as_rank():
        worker(args)
        return
    try:
        framework_probe.check_gpus_for(nproc, args.device)
    except UserError as error:
        sys.exit(f"error: {error}")
    # spawn notes that it uses gloo on CPU and logs the ports it picks (to the root logger): nothing to act on.
    logging.getLogger().setLevel(logging.WARNING)
    with errors.said_once_per_machine(), warnings.catch_warnings():  # the ranks' identical error lines, said once
        warnings.filterwarnings("ignore", "Your model will be trained under CPUONLY")
        ranks = dist.spawn(_spawned, args=(worker, args), nprocs=nproc, join=False)
        # Kubernetes sends SIGTERM to this process only; every rank must hear it to save and stop.
        signal.signal(signal.SIGTERM, lambda signum, frame: _forward(signum, ranks.processes))
        try:
            while not ranks.join():
                pass
        except Exception as error:  # spawn raises a bare Exception naming the worker that failed
            # Stopped by SIGTERM, a collective that timed out, a UserError (1): the worker said it, its status is the
            # job's; anything else comes with its traceback.
            said = [code for code in (STOPPED_STATUS, COLLECTIVE_TIMEOUT_STATUS, 1) if f"code {code}." in str(error)]
            sys.exit(said[0] if said else error)


def _forward(signum: int, processes) -> None:
    for process in processes:
        if process.is_alive():
            os.kill(process.pid, signum)


def launched_as_rank() -> bool:
    """True when a launcher (launch, fleetrun, spawn, a platform) already started this process as one rank."""
    return "PADDLE_TRAINER_ID" in os.environ


def _spawned(worker, args) -> None:
    # When one worker fails, spawn stops the others with SIGTERM: no C++ crash report from paddle for that.
    paddle.disable_signal_handler()
    worker(args)


def rank_environment(rank: int, local_rank: int, world_size: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables paddle's launch sets for one rank of a one-machine job: notebook.launch() gives them to each rank.

    The rendezvous store listens on master_port; the trainer endpoints are named after the ports above it
    (the gloo and NCCL groups meet through the store, not at those ports).
    """
    endpoints = [f"{master_addr}:{master_port + 1 + index}" for index in range(world_size)]
    variables = {
        "PADDLE_TRAINER_ID": str(rank),
        "PADDLE_TRAINERS_NUM": str(world_size),
        "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints),
        "PADDLE_CURRENT_ENDPOINT": endpoints[rank],
        "PADDLE_MASTER": f"{master_addr}:{master_port}",
        "PADDLE_LOCAL_RANK": str(local_rank),
        "PADDLE_RANK_IN_NODE": str(local_rank),
        "PADDLE_LOCAL_SIZE": str(world_size),
        "PADDLE_GLOBAL_RANK": str(rank),
        "PADDLE_GLOBAL_SIZE": str(world_size),
        "PADDLE_NNODES": "1",
        # paddle reads these before PADDLE_MASTER: stale ones from the environment must not win.
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
    if paddle.device.is_compiled_with_cuda():
        variables["FLAGS_selected_gpus"] = str(local_rank)
    if not framework_probe.gpu_available():
        variables["PADDLE_DISTRI_BACKEND"] = "gloo"  # without it, init_parallel_env() makes no global group on CPU
    return variables
