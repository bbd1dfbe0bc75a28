"""--strategy fsdp / hsdp (FSDP2): each rank keeps a shard of every parameter, its gradient and its optimizer state.

The model is sharded unit by unit: the modules of the classes model.py names in FSDP_UNITS (for a transformer,
one line: FSDP_UNITS = (nn.TransformerEncoderLayer,); seam.Task.units), or else each direct child of the model that holds
parameters; then the whole model, for what is left. A unit's full parameters exist only during its forward and
backward, so a rank holds its shards and one whole unit at a time. --activation-checkpointing recomputes the
same units' activations in the backward pass instead of keeping them (any strategy).
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._composable import checkpoint
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from .errors import UserError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def shards(strategy: str, world_size: int) -> bool:
    """Whether the model is sharded: --strategy fsdp or hsdp, on more than one process."""
    return world_size > 1 and strategy in ("fsdp", "hsdp")


def shard(
    model: nn.Module,
    device_type: str,
    world_size: int,
    machines: int,
    amp_dtype: str | None,
    unit_types: tuple = (),
    reshard_after_forward: bool = True,
) -> nn.Module:
    """`model` sharded over the job's ranks (machines 1: fsdp), or within each machine and replicated across the
    `machines` (hsdp: a shard's all-gathers stay on the machine's fast links). Its parameters compute in the
    run's mixed precision (`amp_dtype`: "bf16", "fp16" or None) and gradients are reduced in float32. A unit frees
    its gathered parameters after its forward, or with `reshard_after_forward` False keeps them for its backward
    (one all-gather a step less; FSDP2 keeps the root's anyway).
    Ranks that made `model` on the meta device (engine.whole_on_rank0_only()) get their shards of rank 0's."""
    if machines > 1:
        mesh = init_device_mesh(device_type, (machines, world_size // machines), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device_type, (world_size,))
    policy = MixedPrecisionPolicy(param_dtype=DTYPES.get(amp_dtype), reduce_dtype=torch.float32)
    from_rank0 = any(_every_rank(_on_meta(model)))  # rank 0, which sends, must know too: one small collective
    whole = model.state_dict() if from_rank0 and dist.get_rank() == 0 else {}  # kept until the shards are sent
    for unit in units(model, unit_types):
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    if from_rank0:
        _fill_from_rank0(model, whole, device_type)
    return model


def _fill_from_rank0(model: FSDPModule, whole: dict, device_type: str) -> None:
    """Give a meta-device rank's shards memory on the device, then every rank its shards of rank 0's `whole` state
    dict, and rank 0's buffers that no state dict holds (persistent=False: a table, a constant from the data)."""
    if _on_meta(model):
        model.to_empty(device=device_type)
    set_model_state_dict(model, whole, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    saved = model.state_dict()
    for name, buffer in model.named_buffers():
        if name not in saved:
            dist.broadcast(buffer, src=0)


def _on_meta(model: nn.Module) -> bool:
    return any(parameter.is_meta for parameter in model.parameters())


def _every_rank(value) -> list:
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def checkpoint_activations(model: nn.Module, unit_types: tuple = ()) -> None:
    """--activation-checkpointing: the units' activations are recomputed in the backward pass (state dict keys
    unchanged)."""
    for unit in units(model, unit_types):
        checkpoint(unit)


def units(model: nn.Module, types: tuple = ()) -> list[nn.Module]:
    """The modules of `types` (model.py's FSDP_UNITS; the outermost ones), or the model's children that hold
    parameters."""
    if not types:
        return [child for child in model.children() if next(child.parameters(), None) is not None]
    found = []
    for module in model.modules():
        if module is not model and isinstance(module, types) and not any(_within(module, unit) for unit in found):
            found.append(module)
    if not found:
        names = ", ".join(kind.__name__ for kind in types)
        raise UserError(f"model.py: FSDP_UNITS names {names}, of which build_model()'s network has no module")
    return found


def _within(module: nn.Module, unit: nn.Module) -> bool:
    return any(module is inner for inner in unit.modules())


def is_sharded(model: nn.Module) -> bool:
    return isinstance(getattr(model, "_orig_mod", model), FSDPModule)
