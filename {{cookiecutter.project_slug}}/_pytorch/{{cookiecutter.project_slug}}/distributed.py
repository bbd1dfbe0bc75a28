"""Everything that makes one training script run as many processes.

Who this process is comes from the launcher's environment (torchrun and
torch.distributed.launch set RANK, LOCAL_RANK, WORLD_SIZE; SLURM's srun sets
SLURM_PROCID, ...). With none set, this is rank 0 of 1 and nothing here
does any communication: single process is just the default case.
"""

import contextlib
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import TCPStore
from torch.nn.parallel import DistributedDataParallel

from . import errors, framework_probe, hardware
from .errors import COLLECTIVE_TIMEOUT_STATUS, STOPPED_STATUS, UserError
from .hardware import DistEnv, master_silent, wait_for_port
from .roll_call import RollCall, die_with_parent
from .settings import LAUNCHER

_log = logging.getLogger(__name__)


def read_ranks() -> tuple[int, int, int]:
    """(global rank, local rank, world size) as the launcher, or SLURM, tells them.

    (cli.py turns the --local-rank flag of old torch.distributed.launch versions into LOCAL_RANK.)
    """
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env.get("LOCAL_RANK", 0)), int(env["WORLD_SIZE"])
    if int(env.get("SLURM_NTASKS", 1)) > 1:
        return int(env["SLURM_PROCID"]), int(env["SLURM_LOCALID"]), int(env["SLURM_NTASKS"])
    return 0, 0, 1


def setup(device: str = "auto", timeout_s: float = 1800.0) -> DistEnv:
    """Pick this rank's device and join the process group (nccl on GPU, gloo on CPU)."""
    rank, local_rank, world_size = read_ranks()
    gpus, problem = (framework_probe.gpu_count(), framework_probe.gpu_problem()) if device != "cpu" else (0, None)
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", local_rank + 1))  # torchrun's; srun with one GPU per process
    gpu = hardware.gpu_of_rank(device, local_rank, gpus, problem, processes, warns=local_rank == 0)
    if gpu is None:
        this_device = torch.device("cpu")
    else:
        torch.cuda.set_device(gpu)  # without this every rank would allocate on GPU 0
        this_device = torch.device("cuda", gpu)
    if world_size > 1:
        # torchrun starts each rank in a session of its own: a launcher killed outright (kill -9 of run.sh's
        # process group, as a test or a user does) would leave its ranks training on, holding the folder.
        die_with_parent(os.getppid())
        # NCCL's watchdog, when a collective passes --dist-timeout, aborts the communicator and leaves the process
        # to raise at its next collective (engine.collective_timeouts() says it in one line) rather than end it with
        # a C++ report. Read at init_process_group(); torchrun passes on what launcher.py set.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        roll = _roll_call(rank, local_rank, timeout_s)
        master = os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", 0))
        # spawn: rank 0's process group serves the store; a client that cannot connect prints C++ stacks, and waits
        # for --dist-timeout more than once.
        if LAUNCHER == "spawn" and rank != 0 and not wait_for_port(*master, wait_s=timeout_s):
            raise UserError(master_silent(*master, f"--dist-timeout {timeout_s:g} s"))
        try:
            dist.init_process_group(
                backend="nccl" if gpu is not None else "gloo",
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=timeout_s),
                device_id=this_device if gpu is not None else None,
            )
        except dist.DistStoreError as error:  # the spawn launcher's wait for the other machines, mostly
            missing = f"; {roll.named()} did not" if roll and roll.missing else ""
            raise UserError(
                f"the processes did not all join within --dist-timeout {timeout_s:g} s ({error}{missing}): start "
                "run.sh on every machine with the same NNODES, MASTER_ADDR and MASTER_PORT"
            ) from None
        except dist.DistNetworkError:  # (machine 0 given an address that is not its own)
            raise UserError(master_silent(*master, f"--dist-timeout {timeout_s:g} s")) from None
    # torchrun, torch.distributed.launch, spawn and notebook.launch() set LOCAL_WORLD_SIZE; srun its own.
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", 1)))
    return DistEnv(rank, local_rank, world_size, this_device, local_world_size)


def _roll_call(rank: int, local_rank: int, timeout_s: float):
    """spawn on several machines (a launcher has its own, launcher.py): each machine's first process writes its
    NODE_RANK in the store rank 0 serves, and rank 0 says which machines it still waits for."""
    nnodes = int(os.environ.get("NNODES", 1))
    if LAUNCHER != "spawn" or nnodes < 2 or local_rank != 0:
        return None
    master_addr, master_port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    node_rank = int(os.environ.get("NODE_RANK", 0))
    return store_roll_call(master_addr, master_port, nnodes, node_rank, timeout_s, "--dist-timeout")


def cleanup() -> None:
    if dist.is_initialized():
        # gloo's worker threads free a finished collective's tensors with the GIL held; they get it here. Otherwise
        # the group, freed later with the DDP model while this thread holds the GIL, could wait for them forever.
        time.sleep(0.1)
        dist.destroy_process_group()


def barrier(waiting_for: str = "the other processes") -> None:
    """Return when every rank has come here, each waiting up to --dist-timeout."""
    if dist.is_initialized():
        with _timeout_explained(waiting_for):
            dist.barrier()


def share_from_main(obj, waiting_for: str):
    """Rank 0's `obj` (small, picklable) on every rank; the others wait for it up to --dist-timeout."""
    if not dist.is_initialized():
        return obj
    holder = [obj]
    with _timeout_explained(waiting_for):
        dist.broadcast_object_list(holder, src=0)
    return holder[0]


def _on_rank0_only(read, env, what: str) -> dict:
    """`read()` on rank 0 (`what` it is), {} on the others; a UserError there (an unreadable file, weights of another
    network) ends every rank, said by rank 0, instead of leaving the others waiting for its tensors."""
    weights, problem = {}, None
    if env.is_main:
        try:
            weights = read()
        except UserError as error:
            problem = str(error)
    problem = share_from_main(problem, what)
    if problem:
        raise UserError(problem, shown=env.local_rank == 0)
    return weights


@contextlib.contextmanager
def _timeout_explained(waiting_for: str):
    try:
        yield
    except RuntimeError as error:
        if re.search("Connection (closed|reset) by peer", str(error)):  # gloo: the process is gone
            raise UserError(
                f"another process ended while this one waited for {waiting_for}: its own error line, on its "
                "machine, says why"
            ) from None
        if "Timed out" not in str(error):  # gloo's words
            raise
        raise UserError(f"waited --dist-timeout for {waiting_for}: raise --dist-timeout if that takes longer") from None


def all_reduce_sum(values: list[float], env: DistEnv) -> list[float]:
    """Sum a few numbers over all ranks, in one collective."""
    if env.world_size == 1:
        return list(values)
    totals = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(totals)
    return totals.tolist()


def all_gather_object(obj) -> list:
    """Every rank's `obj`, in rank order (small Python objects only)."""
    if not dist.is_initialized():
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def sync_batch_norm(model: torch.nn.Module, env: DistEnv, enabled: bool) -> torch.nn.Module:
    """--sync-bn: the model's batch normalisation over the global batch, where hardware.synchronises_batch_norm()
    says it can be."""
    layers = sum(isinstance(layer, torch.nn.modules.batchnorm._BatchNorm) for layer in model.modules())
    if hardware.synchronises_batch_norm(enabled, layers, env.world_size, env.on_gpu):
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return model


def wrap_model(
    model: torch.nn.Module, env: DistEnv, find_unused_parameters: bool = False, compile: bool = False,
    channels_last: bool = False, strategy: str = "ddp", activation_checkpointing: bool = False,
    amp_dtype: str | None = None, units: tuple = (), reshard_after_forward: bool = True,
) -> torch.nn.Module:  # fmt: skip
    """The model on this rank's device (in channels-last memory format with --channels-last: convolutions then
    run on channels-last inputs), on several ranks in DistributedDataParallel (`strategy` ddp) or sharded by
    FSDP2 (fsdp, hsdp: fsdp.py; by its `units`, model.py's FSDP_UNITS), then torch.compile()d with --compile (the
    order PyTorch documents).
    unwrap() gives the model back without DDP's and compile's wrappers (FSDP's shards stay)."""
    from . import fsdp  # here: its imports take 2.8 s on an H100 host, and the launcher process needs none of it

    sharded = fsdp.shards(strategy, env.world_size)
    if strategy != "ddp" and not sharded:
        _log.info("--strategy %s on one process: the model is trained whole", strategy)
    # A sharded model goes to the device unit by unit, as fully_shard() shards it: never whole on one GPU.
    memory_format = torch.channels_last if channels_last else torch.preserve_format
    model = model.to(None if sharded else env.device, memory_format=memory_format)
    if activation_checkpointing:
        fsdp.checkpoint_activations(model, units)
    if sharded:
        machines = env.world_size // env.local_world_size if strategy == "hsdp" else 1
        if strategy == "hsdp" and machines == 1:
            _log.info("--strategy hsdp on one machine: sharded over its processes, as fsdp")
        model = fsdp.shard(model, env.device.type, env.world_size, machines, amp_dtype, units, reshard_after_forward)
    elif env.world_size > 1:
        device_ids = [env.local_rank] if env.on_gpu else None
        with _timeout_explained("the other processes' start"):  # its first collective: one may have failed there
            model = DistributedDataParallel(model, device_ids=device_ids, find_unused_parameters=find_unused_parameters)
    if not compile:
        return model
    compiled = torch.compile(model)
    compiled.register_forward_pre_hook(_StaticBatches(env.is_main), with_kwargs=True)
    return compiled


class _StaticBatches:
    """torch.compile's forward pre-hook: the batch dimension of every input stays static. Dynamo would make it dynamic
    at the first batch of another size (an epoch's last), and every later step would run kernels compiled for any
    size, slower than static ones; so a new size compiles once for itself (PyTorch's recompile limit, 8, is far), and
    other dimensions (a text batch padded to its longest) may still turn dynamic. The first step's time, its compile
    included, is said once."""

    def __init__(self, is_main: bool):
        self.is_main, self.started = is_main, None

    def __call__(self, module, args, kwargs) -> None:
        for tensor in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
                torch._dynamo.mark_static(tensor, 0)
        if not module.training:
            return
        if self.started is None:
            self.started = time.perf_counter()
        elif self.started:  # the second training step: the first one has compiled
            if self.is_main:
                _log.info(
                    "--compile: the first step took %.1f s, compiling included", time.perf_counter() - self.started
                )
            self.started = 0.0


def wrap_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler, strategy: str = "ddp"):
    """(model, optimizer, scaler) as the training loop uses them: PyTorch's work as wrap_model() left the model,
    under every strategy (Paddle's sharding wraps them here)."""
    return model, optimizer, scaler


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's model, without torch.compile's wrapper ("_orig_mod.") and DDP's ("module.")."""
    model = getattr(model, "_orig_mod", model)
    return model.module if isinstance(model, DistributedDataParallel) else model


def launch(worker, args) -> None:
    """Run `worker(args)` in this process, or, with the spawn launcher, in NPROC_PER_NODE children."""
    nproc = int(os.environ.get("NPROC_PER_NODE", framework_probe.gpu_count() or 1))
    nnodes = int(os.environ.get("NNODES", 1))
    if LAUNCHER != "spawn" or nproc * nnodes == 1 or launched_as_rank():
        worker(args)
        return
    try:
        framework_probe.check_gpus_for(nproc, args.device)
    except UserError as error:
        sys.exit(f"error: {error}")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # One machine: any free port. Several: the port all machines were told (run.sh's default too).
    os.environ.setdefault("MASTER_PORT", str(_free_port()) if nnodes == 1 else "29500")
    # After a rank fails, spawn logs that it terminates each other one: the failed rank's own error says more.
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    with errors.said_once_per_machine():  # the ranks' identical error lines, said once
        ranks = mp.spawn(_spawned, args=(worker, args, nproc, nnodes), nprocs=nproc, join=False)
        # Kubernetes sends SIGTERM to this process only; every rank must hear it to save and stop.
        signal.signal(signal.SIGTERM, lambda signum, frame: _forward(signum, ranks.processes))
        try:
            while not ranks.join():
                pass
        except mp.ProcessExitedException as exited:
            # The ranks have already printed why: their error, or where they stopped.
            sys.exit(exited.exit_code if exited.exit_code in (STOPPED_STATUS, COLLECTIVE_TIMEOUT_STATUS) else 1)
        except mp.ProcessRaisedException:
            sys.exit(1)  # each failed rank printed its own traceback (_spawned)


def _forward(signum: int, processes) -> None:
    for process in processes:
        if process.is_alive():
            os.kill(process.pid, signum)


def launched_as_rank() -> bool:
    """True when a launcher (torchrun, torch.distributed.launch, srun) already started this process as one rank.

    RANK alone does not tell: Kubernetes operators set it to the pod's (machine's) rank.
    """
    return "LOCAL_RANK" in os.environ or int(os.environ.get("SLURM_NTASKS", 1)) > 1


def _spawned(local_rank: int, worker, args, nproc: int, nnodes: int) -> None:
    node_rank = int(os.environ.get("NODE_RANK", 0))
    os.environ.update(
        RANK=str(node_rank * nproc + local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(nnodes * nproc),
        LOCAL_WORLD_SIZE=str(nproc),
    )
    try:
        worker(args)
    except Exception:
        # spawn would hand the traceback to the parent, which shows only the first dead rank it notices: when
        # rank 1 fails, that may be rank 0 losing its connection to it instead of rank 1's own error.
        traceback.print_exc()
        raise


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rank_environment(rank: int, local_rank: int, world_size: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables torchrun sets for one rank of a one-machine job: notebook.launch() gives them to each rank."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


_ROLL_CALL_KEY = "roll_call"


def store_roll_call(
    master_addr: str, master_port: int, nnodes: int, node_rank: int, join_timeout_s: float, limit: str = "JOIN_TIMEOUT"
) -> RollCall | None:
    """roll_call.py's question in torch's rendezvous store (the launcher's, or with spawn rank 0's process group's,
    on MASTER_PORT: no port more): this machine's NODE_RANK into the store once it listens; on machine 0 also the
    watch (its lines name the wait's `limit`), whose RollCall is returned (None elsewhere: machine 0 alone knows who
    came). A client without a world size is not counted among the store's workers."""

    def connect() -> TCPStore:  # each thread has a client of its own
        if not wait_for_port(master_addr, master_port, wait_s=0):  # a client that cannot connect prints C++ stacks
            raise ConnectionRefusedError(f"nothing listens on {master_addr}:{master_port} yet")
        return TCPStore(master_addr, master_port, is_master=False, timeout=timedelta(seconds=5))

    def say_here() -> None:
        while True:
            try:
                connect().set(f"{_ROLL_CALL_KEY}/{node_rank}", "here")
                return
            except (OSError, RuntimeError):  # not up yet (RuntimeError: torch's DistNetworkError)
                time.sleep(1.0)

    threading.Thread(target=say_here, daemon=True).start()
    if node_rank != 0:
        return None
    roll, clients = RollCall(nnodes), []

    def present() -> set[int]:
        try:
            clients[:] = clients or [connect()]
            return {machine for machine in range(nnodes) if clients[0].check([f"{_ROLL_CALL_KEY}/{machine}"])}
        except (OSError, RuntimeError):
            return set()

    threading.Thread(target=roll.watch, args=(present, join_timeout_s, limit), daemon=True).start()
    return roll
