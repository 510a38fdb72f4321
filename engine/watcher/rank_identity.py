"""Which rank of a distributed job a watched loader belongs to, as torchrun tells each rank.

torchrun (torch.distributed.run) starts every rank with its place in the job in environment
variables: RANK and WORLD_SIZE across the job, LOCAL_RANK and LOCAL_WORLD_SIZE on its node,
GROUP_RANK for the node, TORCHELASTIC_RUN_ID for the job (the same on every node). Reading them
needs no process group and no collective, so watching never waits on another rank.
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
        return None
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
