"""Tune in place a node at a time: local rank 0 searches and announces each switch through the
job's store (a real TCPStore on loopback here); the node's other ranks switch at the same batch,
and a setting that fails on any rank is dropped for the whole node."""

import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from dataloader_tuner.config import TunedSettings
from dataloader_tuner.tune.in_place import InPlaceSearch
from dataloader_tuner.tune.node import UNHEARD_EPOCHS, FollowerSearch, LeaderSearch, NodePlan

from .clocks import SimulatedClock


@pytest.fixture
def store():
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=5))


def node(store, local_world_size=2):
    leader = LeaderSearch(InPlaceSearch(TunedSettings(0), 8, clock=SimulatedClock()), "train", 0,
                          local_world_size,
                          lambda: store)
    followers = [FollowerSearch(TunedSettings(0), "train", 0, r, lambda: store)
                 for r in range(1, local_world_size)]
    return leader, followers


def step(leader, followers, store, cycle_s: float):
    """One batch on every rank, then the store threads' round (run here, in step)."""
    leader.search.clock.advance(cycle_s)
    switches = [leader.after_batch(8, cycle_s)] + [f.after_batch(8, cycle_s) for f in followers]
    for part in (leader, *followers, *followers):  # the leader writes, followers read
        part.exchange(store)
    return switches


def test_the_node_switches_together_at_the_announced_batch(store):
    leader, (follower,) = node(store)
    leader.epoch_started(0)
    follower.epoch_started(0)
    switched_at = {}
    for batch in range(1, 400):
        rate = 0.010 if leader.current.num_workers == 0 else 0.005  # workers pay
        leader_switch, follower_switch = step(leader, [follower], store, rate)
        if leader_switch is not None:
            switched_at["leader"] = (batch, leader_switch)
        if follower_switch is not None:
            switched_at.setdefault("follower", (batch, follower_switch))
        if "leader" in switched_at:
            break
    assert switched_at["leader"] == switched_at["follower"]  # the same batch, the same setting
    assert switched_at["leader"][1].num_workers > 0
    plan = NodePlan.from_json(store.get("dataloader-tuner/0/train/node0/plan"))
    assert plan.from_batch == switched_at["leader"][0] and plan.setting == leader.current
    assert "switched with the node" in follower.decisions[-1].verdict


def test_a_plan_learnt_late_applies_at_once_or_from_the_next_epoch(store):
    follower = FollowerSearch(TunedSettings(0), "train", 0, 1, lambda: store)
    follower.epoch_started(0)
    for _ in range(10):
        assert follower.after_batch(8, 0.01) is None
    follower.latest = NodePlan(1, 0, 5, TunedSettings(2), False)  # announced for batch 5: past
    assert follower.after_batch(8, 0.01) == TunedSettings(2)
    follower.latest = NodePlan(2, 0, 50, TunedSettings(4), False)  # batch 50, but the epoch ends
    follower.epoch_started(1)
    assert follower.current == TunedSettings(4)


def test_a_setting_that_fails_on_a_follower_is_dropped_for_the_node(store):
    leader, (follower,) = node(store)
    leader.epoch_started(0)
    follower.epoch_started(0)
    for _ in range(400):
        if step(leader, [follower], store, 0.01 if follower.current.num_workers == 0
                else 0.005)[1] is not None:
            break
    tried = follower.current
    assert tried.num_workers > 0
    assert follower.setting_failed(tried, "DataLoader worker (pid 1) is killed by signal") \
        == TunedSettings(0)
    follower.exchange(store)  # tells the leader
    leader.exchange(store)
    step(leader, [follower], store, 0.01)
    assert tried in leader.search.failed
    assert "on local rank 1" in leader.decisions[-1].verdict
    assert leader.current == TunedSettings(0) and follower.current == TunedSettings(0)


def test_the_node_is_judged_by_its_slowest_rank(store):
    """Ranks that do not synchronise: rank 1 takes twice as long per batch under the same
    setting; the leader's search counts its own batches at rank 1's pace."""
    leader, (follower,) = node(store)
    leader.epoch_started(0)
    follower.epoch_started(0)
    for _ in range(400):
        leader.search.clock.advance(0.010)  # the node moves at its slowest rank's pace
        leader.after_batch(8, 0.005)
        follower.after_batch(8, 0.010)
        follower.exchange(store)
        leader.exchange(store)
        if leader.search.measured:
            break
    first = leader.search.measured[0]
    assert abs(leader.slowest_factor() - 2.0) < 0.05
    assert abs(first.samples_per_s - 8 / 0.010) / 800 < 0.1  # rank 1's pace, not 1600/s


def test_a_follower_that_hears_no_plan_stops_following(store):
    """No store, or local rank 0 not tuning: after UNHEARD_EPOCHS the rank runs its own
    setting untuned (not a plan-holding tuned loader for the rest of the job)."""
    follower = FollowerSearch(TunedSettings(2), "train", 0, 1, lambda: None)
    for epoch in range(UNHEARD_EPOCHS):
        follower.epoch_started(epoch)
        assert not follower.finished
    follower.epoch_started(UNHEARD_EPOCHS)
    assert follower.finished and follower.current == TunedSettings(2) and follower.done()
    assert "no plan from the node's local rank 0" in follower.decisions[-1].verdict


def test_a_late_failure_of_a_setting_measured_before_only_bars_it(store):
    """A follower reports a failure of a setting the leader has already moved on from: the
    leader keeps measuring what runs now and never tries that setting again."""
    leader, (follower,) = node(store)
    leader.epoch_started(0)
    follower.epoch_started(0)
    leader._failures.append((TunedSettings(6), "on local rank 1: worker killed"))
    running = leader.current
    assert leader.after_batch(8, 0.01) is None and leader.current == running
    assert TunedSettings(6) in leader.search.failed
    assert "not tried again" in leader.decisions[-1].verdict


def test_the_store_threads_start_and_stop(store):
    leader, (follower,) = node(store)
    leader.start()
    follower.start()
    leader._outbox.append(NodePlan(1, 0, 3, TunedSettings(2), False))
    deadline = time.monotonic() + 5
    while follower.latest is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert follower.latest == NodePlan(1, 0, 3, TunedSettings(2), False)
    leader.close()
    follower.close()


NODE_JOB = """
import json, os, sys, time
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from dataloader_tuner import watch

class Remote(Dataset):  # each sample waits 2 ms, as on remote storage: workers pay
    def __len__(self):
        return 4000
    def __getitem__(self, i):
        time.sleep(0.002)
        return torch.tensor([float(i)])

rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
sampler = DistributedSampler(Remote(), shuffle=True, seed=7)
loader = watch(DataLoader(Remote(), batch_size=4, sampler=sampler), name="train",
               db=sys.argv[1], tune=True)
settings, orders_ok = [], True
for epoch in range(int(sys.argv[2])):
    sampler.set_epoch(epoch)
    seen = []
    for batch in loader:
        settings.append(loader.search.current.num_workers if loader.search else None)
        seen += [int(i) for i in batch.flatten()]
        dist.all_reduce(batch.sum())
        time.sleep(0.003)
    orders_ok &= seen == list(iter(sampler))  # the model sees what it would unwatched
result = loader.close()
json.dump({"settings": settings, "orders_ok": orders_ok,
           "decisions": [d.verdict for d in loader.search.decisions]},
          open(f"rank{rank}.json", "w"))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_node_s_ranks_tune_in_place_together(tmp_path):
    """Two ranks of a real torchrun job with tune=True: rank 0 searches, rank 1 follows; at
    every batch both run the same num_workers (a switch at most a few batches late), the
    samples each rank sees are its sampler's, and only rank 0 saves the choice."""
    import json
    import os
    import sys

    from .browser import free_port
    from .conftest import ROOT
    from .jobs import run_job

    script = tmp_path / "train.py"
    script.write_text(NODE_JOB)
    env = dict(os.environ, PYTHONPATH=ROOT, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    job = run_job(
        [sys.executable, "-m", "torch.distributed.run", "--local-addr", "127.0.0.1",
         "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(script),
         str(tmp_path / "runs.sqlite"), "12"],
        cwd=tmp_path, env=env)
    assert job.returncode == 0, job.stderr[-4000:]
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert rank0["orders_ok"] and rank1["orders_ok"]
    assert len(rank0["settings"]) == len(rank1["settings"])
    differing = sum(a != b for a, b in zip(rank0["settings"], rank1["settings"]))
    switches = sum(a != b for a, b in zip(rank0["settings"], rank0["settings"][1:]))
    assert switches >= 1, rank0["decisions"]  # the search did try other settings
    assert differing <= 3 * switches, (differing, switches)
    assert rank0["settings"][-1] == rank1["settings"][-1]
    assert any("switched with the node" in d for d in rank1["decisions"])
    assert (tmp_path / "dataloader-tuner-train.json").exists() == any(
        d.startswith("chosen") for d in rank0["decisions"])
