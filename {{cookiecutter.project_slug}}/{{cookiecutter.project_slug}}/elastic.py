"""Elastic jobs: NNODES=MIN:MAX machines, and a job that goes on when one of them is lost.

The launcher restarts every rank when a machine is lost or joins (torchrun's c10d rendezvous; Paddle's
launcher through etcd); each restarted rank resumes from the last save at the new world size. This module
holds what run.sh's platform step and the restarted ranks need to know about that: the range, whether this
bake can run one, a global batch that every allowed world size reaches, and the job's name (run.sh exports
it to the ranks as ELASTIC_JOB_ID, so that a restart knows its own job's folder lock).
"""

import importlib.util
import os
from collections.abc import Mapping

from .errors import PlatformError

JOB_ID_VARIABLE = "ELASTIC_JOB_ID"
ETCD_VARIABLE = "ETCD_ENDPOINT"


def machine_range(name: str, text: str) -> tuple[int, int]:
    """NNODES as (fewest, most) machines: "2" is (2, 2), "1:4" is (1, 4)."""
    low, colon, high = text.strip().partition(":")
    try:
        fewest, most = int(low), int(high if colon else low)
    except ValueError:
        fewest = most = 0
    if fewest < 1 or most < fewest:
        raise PlatformError(
            f"{name}={text!r} is not a whole number of 1 or more, nor a range MIN:MAX of machines (1 <= MIN <= MAX)"
        )
    return fewest, most


def refusal(framework: str, launcher: str, env: Mapping[str, str]) -> str | None:
    """Why this bake cannot run an elastic job here, or None."""
    if framework == "pytorch" and launcher != "torchrun":
        return (
            f"an elastic job (a range of machines) runs with torchrun; this project was baked with launcher={launcher}: "
            "bake it again with launcher=torchrun, or give NNODES one number"
        )
    if framework == "paddle" and launcher == "spawn":
        return (
            "an elastic job (a range of machines) runs with Paddle's launch or fleetrun; this project was baked with "
            "launcher=spawn: bake it again with launcher=launch, or give NNODES one number"
        )
    if framework == "paddle" and not etcd_endpoint(env):
        return (
            f"an elastic Paddle job needs an etcd server that every machine reaches: set {ETCD_VARIABLE}=HOST:PORT "
            "(without it Paddle's launcher waits forever), or give NNODES one number"
        )
    if framework == "paddle" and importlib.util.find_spec("etcd3") is None:
        return "an elastic Paddle job talks to etcd through the etcd3 package: pip install etcd3"
    return None


def etcd_endpoint(env: Mapping[str, str]) -> str | None:
    """HOST:PORT of the etcd server: ETCD_ENDPOINT, or a PaddleJob's etcd:// master."""
    master = env.get("PADDLE_MASTER", "")
    return env.get(ETCD_VARIABLE) or (master.removeprefix("etcd://") if master.startswith("etcd://") else None)


def batch_refusal(global_batch: int | None, batch_size: int, nproc: int, fewest: int, most: int) -> str | None:
    """--global-batch-size G must be reachable by every world size a restart may bring, or said at the start."""
    if global_batch is None:
        return None
    missed = [machines for machines in range(fewest, most + 1) if global_batch % (batch_size * nproc * machines)]
    if not missed:
        return None
    sizes = ", ".join(str(machines * nproc) for machines in missed)
    return (
        f"--global-batch-size {global_batch} is not a multiple of --batch-size {batch_size} x the world size on "
        f"{'/'.join(map(str, missed))} machine(s) ({sizes} processes), which this elastic job of {fewest} to {most} "
        "machines may come to: choose a global batch that each reaches, or another --batch-size"
    )


def job_name(env: Mapping[str, str], package: str, port: int | None) -> str:
    """The elastic job's name, the same on every machine: JOB_ID, a Kubeflow job's name, else the project's and
    MASTER_PORT's (two jobs cannot share a port; with Paddle the name keeps jobs apart in etcd, nothing else does)."""
    return env.get("JOB_ID") or env.get("PET_RDZV_ID") or env.get("PADDLE_JOB_ID") or f"{package}-{port}"


def job_id() -> str | None:
    """The elastic job this rank belongs to (run.sh's ELASTIC_JOB_ID), or None outside one."""
    return os.environ.get(JOB_ID_VARIABLE) or None


def restart_line(saved_world: int, world: int, local_world: int, where: str) -> str:
    """The one line a rank 0 that resumes inside an elastic job logs: what changed, and from where it goes on."""
    change = "machine(s) lost" if world < saved_world else "machine(s) joined" if world > saved_world else "same size"
    machines = max(world // max(local_world, 1), 1)
    return (
        f"elastic job {job_id()}: now {machines} machine(s), world size {world} (the save's was {saved_world}: "
        f"{change}); resumed from {where}"
    )
