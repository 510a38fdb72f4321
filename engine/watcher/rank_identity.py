"""Which rank of a distributed job a watched loader belongs to, as torchrun tells each rank.

torchrun (torch.distributed.run) starts every rank with its place in the job in environment
variables: RANK and WORLD_SIZE across the job, LOCAL_RANK and LOCAL_WORLD_SIZE on its node,
GROUP_RANK for the node, TORCHELASTIC_RUN_ID for the job (the same on every node). Reading them
needs no process group and no collective, so watching never waits on another rank.

Slurm without torchrun (``srun python train.py``) tells each task the same in its own words:
SLURM_PROCID and SLURM_NTASKS across the job step, SLURM_LOCALID on its node, SLURM_NODEID,
SLURM_TASKS_PER_NODE ("2(x3),1": tasks on each node, in node order) and SLURM_JOB_ID with
SLURM_STEP_ID (each srun of one allocation is a job of its own). They are read where torchrun's
are not set; the ranks' reports then go through the default process group's store, which the
job makes with ``init_process_group`` as under torchrun (job_report.job_store).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RankIdentity:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    job_id: str  # torchrun's run id: the same for every rank of one job

    def to_dict(self) -> dict:
        return asdict(self)


def rank_identity(environ: dict | None = None) -> RankIdentity | None:
    """This process's place in a torchrun job, or None outside one."""
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return slurm_identity(env)
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local_rank = int(env.get("LOCAL_RANK", rank))
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        node_rank = int(env.get("GROUP_RANK", env.get("NODE_RANK", rank // max(local_world, 1))))
    except ValueError:
        return None
    # torchrun's run id is "none" unless --rdzv-id is given: then the store's address (its
    # port is picked afresh for each job) tells jobs apart.
    job = env.get("TORCHELASTIC_RUN_ID", "")
    if job in ("", "none"):
        job = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    return RankIdentity(rank, world, local_rank, local_world, node_rank, job)


def slurm_identity(env) -> RankIdentity | None:
    """This task's place in a Slurm job step (``srun``), or None outside one: a batch script's
    own process (SLURM_PROCID 0 of SLURM_NTASKS 1) is no distributed job."""
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env or "SLURM_JOB_ID" not in env:
        return None
    try:
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        node = int(env.get("SLURM_NODEID", 0))
        local_rank = int(env.get("SLURM_LOCALID", rank))
        per_node = tasks_per_node(env.get("SLURM_TASKS_PER_NODE", ""))
    except ValueError:
        return None
    if world < 2:
        return None
    local_world = per_node[node] if node < len(per_node) else world
    job = f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    return RankIdentity(rank, world, local_rank, local_world, node, job)


def tasks_per_node(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE's tasks on each node in order: "2(x3),1" -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in filter(None, text.split(",")):
        tasks, _, repeat = part.partition("(x")
        counts += [int(tasks)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts
