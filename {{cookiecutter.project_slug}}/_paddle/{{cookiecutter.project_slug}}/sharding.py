"""--strategy sharding (the basic loop): each rank keeps a part of the optimizer state (stage 1), also of the
gradients (2), also of the parameters (3), instead of all of it.

Stage 1 is fleet's optimizer sharding, which runs on CPUs and GPUs under every launcher: the optimizer steps the
parameters of its own part and passes them on, so training goes exactly as data parallel does. Stages 2 and 3
are paddle's group_sharded_parallel() (levels os_g and p_g_os), which runs on GPUs only.
"""

import contextlib
from unittest import mock

import paddle
import paddle.distributed as dist
from paddle.distributed import fleet
from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.hybrid_parallel_optimizer import (
    HybridParallelClipGrad,
)
from paddle.distributed.fleet.meta_parallel import MetaParallelBase
from paddle.distributed.sharding import group_sharded_parallel

from .errors import UserError

LEVELS = {2: "os_g", 3: "p_g_os"}  # group_sharded_parallel()'s names of stages 2 and 3


def stage_of(strategy: str) -> int:
    """The stage of a strategy as cli.py names it ("sharding stage N"); 0 for data parallel."""
    return int(strategy.rpartition(" ")[2]) if strategy.startswith("sharding") else 0


def check_device(strategy: str, on_gpu: bool) -> None:
    stage = stage_of(strategy)
    if stage > 1 and not on_gpu:
        raise UserError(
            f"--sharding-stage {stage}: paddle shards gradients and parameters on GPUs only (group_sharded_parallel "
            "takes no CPU); on CPUs use --sharding-stage 1, which shards the optimizer state"
        )


def fleet_strategy(find_unused_parameters: bool, world_size: int, strategy: str) -> fleet.DistributedStrategy:
    """What fleet.init() wraps the model and optimizer by: data parallel, or stage 1 over all ranks."""
    chosen = fleet.DistributedStrategy()
    chosen.find_unused_parameters = find_unused_parameters
    if stage_of(strategy) == 1:
        chosen.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": world_size}
    return chosen


def shard_stages_2_and_3(model, optimizer, scaler, strategy: str):
    """(model, optimizer, scaler) of stage 2 or 3, where group_sharded_parallel() wraps all three."""
    return group_sharded_parallel(model, optimizer, LEVELS[stage_of(strategy)], scaler=scaler)


def gather_parameters(model) -> None:
    """Stage 3: the whole parameters on every rank (a collective of all ranks), before a state dict is taken."""
    if hasattr(model, "get_all_parameters"):  # group_sharded_parallel()'s stage 3 wrapper
        model.get_all_parameters()


def innermost(optimizer) -> paddle.optimizer.Optimizer:
    """The user's optimizer inside fleet's wrappers; its parameter list is this rank's part under stage 1."""
    while hasattr(optimizer, "_inner_opt"):
        optimizer = optimizer._inner_opt
    return optimizer


def holds_part(optimizer) -> bool:
    """Whether this rank's optimizer state is its part only (each rank then saves its own)."""
    return getattr(optimizer, "_sharding_enable", False) or type(optimizer).__name__.startswith("GroupSharded")


def clips_in_step(optimizer, max_norm: float) -> bool:
    """Clip by the global norm inside a stage 1 optimizer's step, where the gradients are first reduced (before
    it each rank holds its own, whose norm is not the global one); False for any other optimizer."""
    if not getattr(optimizer, "_sharding_enable", False):
        return False
    inner = innermost(optimizer)
    if inner._grad_clip is None:
        clip = paddle.nn.ClipGradByGlobalNorm(max_norm)
        inner._grad_clip = HybridParallelClipGrad(clip, fleet.get_hybrid_communicate_group(), False, None)
    return True


def unwrapped(model: paddle.nn.Layer) -> paddle.nn.Layer:
    """The user's model inside fleet's wrapper or group_sharded_parallel()'s (the model itself where neither)."""
    if isinstance(model, MetaParallelBase):
        return model._layers
    return model._layer if type(model).__name__.startswith("GroupSharded") else model


def groups_of_all_ranks_are_the_global_group(on_gpu: bool, world_size: int):
    """While fleet.init() makes its groups on CPU, one of all ranks is the global group, not a new one.

    Paddle's gloo groups meet under the same store keys, group after group: a rank can read a peer's address from
    the group before and fail with "Connection refused" or a TIMEOUT (1 in 4 two-machine jobs on a busy host).
    For data parallel and stage 1, fleet's groups of several ranks hold all ranks, which the global group joins."""
    if on_gpu:
        return contextlib.nullcontext()
    all_ranks, new_group = list(range(world_size)), dist.new_group

    def group(ranks=None, *args, **kwargs):
        return dist.get_group(0) if ranks is None or sorted(ranks) == all_ranks else new_group(ranks, *args, **kwargs)

    return mock.patch.object(dist, "new_group", group)
