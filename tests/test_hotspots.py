"""Where the loader's time goes (instrument/sampler.py, analyse/hotspots.py): sampled inside
real workers, merged, and checked against the known make-up of a dataset and against an
independent profile (cProfile) of a plain loop over it."""

import cProfile
import json
import os
import sys
import pstats
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader

from dataloader_tuner.analyse.hotspots import SampledProfile, stage_of
from dataloader_tuner.instrument.frames import named
from dataloader_tuner.instrument.sampler import StackSampler
from dataloader_tuner.run.runner import RunRequest, run_to_completion

from dataloader_tuner import ProfileResult

from .conftest import dataset_path
from .second_look import agreeing_on_a_second_look
from .test_cli import cli
from .datasets import known_stages, waiting_stages

FUNCTIONS = tuple(known_stages.SHARES)
WORK_FILE_PATH = os.path.join("/p", "engine", "instrument", "probes.py")


def _shares_of(result) -> dict[str, float]:
    """The three functions' total shares, over their sum."""
    found = {h["function"]: h["total_share"] for h in result.hotspots
             if h["function"] in FUNCTIONS}
    total = sum(found.values())
    return {name: found.get(name, 0.0) / total for name in FUNCTIONS}


def _cprofile_shares() -> dict[str, float]:
    """The known stages' cumulative time (cProfile's clock: the time passing) in a plain
    single-process loop over known_stages, over their sum."""
    profiler = cProfile.Profile()
    loader = DataLoader(known_stages.KnownStages(), batch_size=8)
    profiler.enable()
    for i, _ in enumerate(loader):
        if i == 40:
            break
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    cumulative = {name: sum(v[3] for (f, _, n), v in stats.items() if n == name)
                  for name in FUNCTIONS}
    total = sum(cumulative.values())
    return {name: t / total for name, t in cumulative.items()}


def _profile_and_check(workers: int, seconds: float, tolerance: float, tmp_path) -> None:
    """A profile from the command line, its --json and its --speedscope file (a second one
    where the first's shares disagree: tests/second_look.py)."""
    def profile(folder) -> tuple[ProfileResult, dict]:
        export = folder / "stacks.speedscope.json"
        done = cli("profile", dataset_path("known_stages.py"), "--num-workers", str(workers),
                   "--seconds", str(seconds), "--json", "--speedscope", str(export),
                   db=str(folder / "runs.db"))
        assert done.returncode == 0, done.stderr
        return ProfileResult.from_dict(json.loads(done.stdout)), json.loads(export.read_text())

    agreeing_on_a_second_look(
        tmp_path, profile, lambda run: _check_profile(workers, seconds, tolerance, *run))


def _check_profile(workers: int, seconds: float, tolerance: float, result: ProfileResult,
                   export: dict) -> None:
    assert result.status == "ok", result.error
    _check_speedscope(export, result)
    seen = result.stacks_sampled
    assert seen["enough"] and seen["processes"] >= max(workers, 1)  # (+ the main process)
    # what the handlers took, measured in each process and shown (bench/profile_cost.py: ~1%;
    # a CI run under load read 2.03%: each look costs more on a busy host)
    assert 0 < seen["sampling_share"] < 0.03, seen
    # the ceiling, from the run's own figures (docs/ceiling.md): it spins on 2 CPUs
    ceiling = result.ceiling
    assert ceiling["samples_per_s"] >= 0.8 * result.samples_per_s
    if workers:
        assert ceiling["binding"] == "cpu", ceiling
    elif ceiling["binding"] == "cpu":  # one CPU making batches, two: ~twice with workers
        assert ceiling["samples_per_s"] >= 1.5 * result.samples_per_s, ceiling
        assert "hand-off to the main process is not seen" in ceiling["sentence"]
    else:  # other load took a CPU as the run started: workers would not pay
        assert ceiling["binding"] == "without_workers", ceiling
        assert ceiling["limits"]["cpu"] <= ceiling["limits"]["without_workers"], ceiling
    shares = _shares_of(result)
    independent = _cprofile_shares()
    print(f"{workers} workers, {seconds} s: ours {shares}, cProfile's {independent}, known "
          f"{known_stages.SHARES}; {seen}")  # the figures a closing note quotes (pytest -rP)
    for name, known in known_stages.SHARES.items():
        assert shares[name] == pytest.approx(known, abs=tolerance), (name, shares, seen)
        assert shares[name] == pytest.approx(independent[name], abs=tolerance), (
            name, shares, independent)
    stages = {s["stage"]: s["share"] for s in result.stages}
    assert sum(stages.values()) == pytest.approx(1.0, abs=0.01)
    # The spins are the dataset's own code: none of the fetch is read as reading, decoding or
    # a transform, and it is the top stage. The rest is the hand-off: the main process
    # rebuilding batches and, in each worker, torch's queue feeder and multiprocessing's
    # resource sharer (hand-off since a931115; 0.13-0.21 of the work with 2 workers here, so
    # "your __getitem__" read 0.74-0.84 on the same code, loaded CI included)
    assert set(stages) <= {"your __getitem__", "collate", "hand-off"}, stages
    assert stages["your __getitem__"] == max(stages.values()) > 0.6, stages
    top = result.hotspots[0]
    assert top["function"] == "KnownStages.__getitem__" and top["file"].endswith(
        "known_stages.py")


def _check_speedscope(doc: dict, result: ProfileResult) -> None:
    """The export holds the stacks the shares came from: rooted at their stages, weighing
    the seconds sampled, the three functions in them."""
    frames = doc["shared"]["frames"]
    (profile,) = doc["profiles"]
    assert profile["type"] == "sampled" and profile["unit"] == "seconds"
    assert len(profile["samples"]) == len(profile["weights"]) > 3
    assert all(0 <= i < len(frames) for stack in profile["samples"] for i in stack)
    roots = {frames[stack[0]]["name"] for stack in profile["samples"]}
    assert roots == {f"stage: {s['stage']}" for s in result.stages}, roots
    assert sum(profile["weights"]) == pytest.approx(result.stacks_sampled["seconds"], rel=0.01)
    named = {f["name"].split(".")[-1] for f in frames}
    assert set(FUNCTIONS) <= named, named


@pytest.mark.slow  # 5.5 s: its 12 s siblings below check the same shares closer
@pytest.mark.host_speed
def test_a_profile_finds_the_known_shares_inside_its_workers(tmp_path):
    """A short run: within 10 points (a few hundred looks; the kernel's tick sets the rate)."""
    _profile_and_check(2, 3.0, 0.1, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.host_speed
def test_a_longer_profile_agrees_within_five_points(workers, tmp_path):
    """~1,000-2,000 looks: within 5 points of the known make-up and of cProfile's."""
    _profile_and_check(workers, 12.0, 0.05, tmp_path)


@pytest.mark.slow  # a 6 s profile; its unit sibling below is quick
@pytest.mark.host_speed
def test_a_mostly_waiting_worker_is_seen_where_it_waits(tmp_path):
    """60% of each sample a sleep: a CPU-time timer alone never looked there (the wait's time
    went to the spins: read_bytes 0.05 of the three, decode 0.47); a second timer on the time
    passing charges it where it passed, and the CPU stays the spins'. The truth is the workers'
    own clock around each stage: under load a sleep wakes late and a spin is preempted (CI once
    saw read 0.67, decode 0.17 against the nominal 0.6, 0.25)."""
    clock = tmp_path / "clock"
    clock.mkdir()
    done = cli("profile", dataset_path("waiting_stages.py"), "--num-workers", "2",
               "--seconds", "6", "--json", db=str(tmp_path / "runs.db"),
               env_extra={"WAITING_STAGES_CLOCK": str(clock)})
    assert done.returncode == 0, done.stderr
    result = ProfileResult.from_dict(json.loads(done.stdout))
    names = tuple(waiting_stages.SHARES)
    found = {h["function"]: h for h in result.hotspots if h["function"] in names}
    total = sum(h["total_share"] for h in found.values())
    shares = {name: found[name]["total_share"] / total for name in names}
    timed = waiting_stages.own_clock_shares(str(clock))
    print(f"sampled {shares}, the workers' own clock {timed}")  # (pytest -rP)
    for name in names:
        assert shares[name] == pytest.approx(timed[name], abs=0.08), (shares, timed,
                                                                      result.stacks_sampled)
    # read_bytes is its own leaf (the sleep has no Python frame): its time, hardly any CPU
    read = found["read_bytes"]
    assert read["cpu_share"] < 0.2 * read["self_share"], read
    waited = {s["stage"]: s["share"] - s["cpu_share"] for s in result.stages}
    assert waited["your __getitem__"] > 0.4, result.stages


def test_only_a_process_that_is_all_the_loader_s_looks_on_the_time_passing():
    """A worker (or the engine's own process) gets the second timer; a job's own process,
    sampled only inside next(), keeps the CPU timer alone (its step is not the loader's); both
    timers go when the sampler stops."""
    from dataloader_tuner.record.ledger import NEXT_WINDOW

    loader_s = StackSampler().start()
    assert loader_s is not None and loader_s.wall is not None
    loader_s.stop()
    assert loader_s.wall.timer._id is None and loader_s.timer._id is None
    job_s = StackSampler(window=NEXT_WINDOW).start()
    assert job_s is not None and job_s.wall is None
    job_s.stop()


def test_the_handler_s_cost_is_kept_within_its_share_by_spacing_the_looks():
    """A look's cost (its handler's CPU) over each second sets how far apart the next looks
    are: the engine's own process on detectron2_style took 1.0% in 148 looks a second (and
    ~3% of the rate); the stretch lands on LOOK_SHARE in one step, holds there, relaxes once
    looks are cheap, and never goes past MAX_STRETCH."""
    from dataloader_tuner.instrument.sampler import LOOK_SHARE, MAX_STRETCH, HandlerCost

    cost = HandlerCost()
    now = cost.second_began

    def second(looks: int, each_s: float) -> None:
        nonlocal now
        for _ in range(looks):
            now += (1.0 + 1e-9) / looks
            cost.paid(each_s, now)

    second(148, 70e-6)
    assert cost.stretch == pytest.approx(148 * 70e-6 / LOOK_SHARE, rel=0.02)
    for _ in range(3):  # as many looks as the stretch leaves: the same share, the same stretch
        second(round(148 / cost.stretch), 70e-6)
        assert cost.stretch == pytest.approx(148 * 70e-6 / LOOK_SHARE, rel=0.05)
    second(40, 10e-6)  # cheap looks: back towards every interval
    assert cost.stretch == 1.0
    second(148, 1e-3)
    assert cost.stretch == MAX_STRETCH
    assert cost.since_take == pytest.approx(148 * 70e-6 * (1 + 3 / 2.59) + 40 * 10e-6 + 0.148,
                                            rel=0.02)


@pytest.mark.slow  # a sampled loop of 4 s
def test_a_sampler_whose_looks_are_dear_looks_less_often(monkeypatch):
    """Looks made dear (120 us more each, a deep stack's walk): over the run's later seconds
    the handler takes about LOOK_SHARE of the time, not the ~1% every interval would cost.
    The cap on the spacing is raised for the test: under CI's load a look cost ~220 us, the
    spacing sat at MAX_STRETCH (4.00) and the share at 0.0067, the cap's and not the
    controller's doing."""
    from dataloader_tuner.instrument import sampler as sampler_module

    monkeypatch.setattr(sampler_module, "MAX_STRETCH", 16.0)
    walk = sampler_module.read_stack

    def dear_walk(frame):
        until = time.thread_time() + 120e-6
        while time.thread_time() < until:
            pass
        return walk(frame)

    monkeypatch.setattr(sampler_module, "read_stack", dear_walk)
    sampler = StackSampler().start()
    assert sampler is not None and sampler.wall is not None
    began = time.monotonic()
    spent = []
    while time.monotonic() - began < 4.0:
        sum(i * i for i in range(2000))
        if not spent and time.monotonic() - began > 2.0:  # from the third second
            spent.append((sampler.cost.since_take, time.monotonic()))
    sampler.stop()
    share = (sampler.cost.since_take - spent[0][0]) / (time.monotonic() - spent[0][1])
    unstretched = sampler.cost.stretch * share
    print(f"looks {sampler.looks}, share {share:.4f}, stretch {sampler.cost.stretch:.2f}")
    assert unstretched > 2 * sampler_module.LOOK_SHARE  # dear enough to be spaced out
    assert sampler.cost.stretch < sampler_module.MAX_STRETCH  # the controller's, not the cap's
    assert share < 1.5 * sampler_module.LOOK_SHARE


def test_the_sampler_charges_each_thread_its_own_cpu():
    """A busy helper thread and a sleeping main one: the CPU goes to the helper's stack; the
    main thread's sleep, outside any fetch, is charged nothing."""
    stop = threading.Event()

    spun = []

    def busy_helper():
        # until its own CPU clock has 0.3 s (a fixed 0.5 s sleep gave it ~0.17 s on a host
        # running at a third of its speed), or 20 s have passed
        deadline = time.monotonic() + 20.0
        while time.thread_time() < 0.3 and time.monotonic() < deadline:
            pass
        spun.append(time.thread_time())
        stop.wait()

    helper = threading.Thread(target=busy_helper, name="QueueFeederThread")
    sampler = StackSampler(interval_s=0.002).start()
    assert sampler is not None
    helper.start()
    while not spun and helper.is_alive():
        time.sleep(0.05)
    stop.set()
    helper.join()
    sampler.stop()
    sampled = sampler.take()
    helper_cpu = sum(cpu for role, frames, cpu, wall, looks in sampled
                     if role == "QueueFeederThread")
    main_wall = sum(wall for role, frames, cpu, wall, looks in sampled if role == "main")
    assert helper_cpu > 0.6 * spun[0] and main_wall < 0.1, (helper_cpu, spun, main_wall)
    profile = SampledProfile()
    profile.add(1, sampled)
    stages = {s["stage"] for s in profile.merged()["stages"]}
    assert stages == {"hand-off"}  # the feeder thread's; the main thread's sleep is not the loader's


@pytest.mark.slow  # a sampled loop of 5 s
@pytest.mark.host_speed  # sampled shares against the known make-up
def test_a_python_loop_between_c_calls_is_seen_where_it_spends_its_time():
    """The spins of known_stages, in this process: each function seen near its share (a thread
    that looked instead saw only the torch call, where the GIL was let go: 0 for each). ~380
    looks in 5 s (the looks' cost share stretches them): within 0.1, about four standard errors
    (0.026) of a share near 0.5. (2 s gave ~215 looks, 0.1 three standard errors: CI saw 0.39.)"""
    dataset = known_stages.KnownStages()
    sampler = StackSampler(interval_s=0.001).start()
    started = time.monotonic()
    while time.monotonic() - started < 5.0:
        dataset[0]
    sampler.stop()
    cpu = {name: 0.0 for name in FUNCTIONS}
    for role, frames, spent, wall, looks in sampler.take():
        for name in FUNCTIONS:
            if any(f[2] == name for f in frames):
                cpu[name] += spent
    total = sum(cpu.values())
    for name, known in known_stages.SHARES.items():
        assert cpu[name] / total == pytest.approx(known, abs=0.1), (cpu, sampler.looks)


def _frame(path, name):
    return (path, 1, name, 1)


def test_stages_are_read_from_the_frames():
    getitem = _frame("/p/engine/instrument/probes.py", "TimedMapDataset.__getitems__")
    loop = _frame("/t/torch/utils/data/_utils/worker.py", "_worker_loop")
    user = _frame("/home/u/data.py", "Folder.__getitem__")
    compose = _frame("/t/torchvision/transforms/transforms.py", "Compose.__call__")
    module = _frame("/t/torch/nn/modules/module.py", "Module._wrapped_call_impl")
    crop = _frame("/t/torchvision/transforms/transforms.py", "RandomResizedCrop.forward")
    pil_load = _frame("/s/PIL/ImageFile.py", "ImageFile.load")
    pil_open = _frame("/s/PIL/Image.py", "open")
    get = _frame("/usr/lib/python3/multiprocessing/queues.py", "Queue.get")

    def stage(*root_first, role="main"):
        return stage_of(role, tuple(reversed(root_first)))

    assert stage(loop, getitem, user, compose, module, crop) == "transform: RandomResizedCrop"
    assert stage(loop, getitem, user, pil_load) == "decode"
    assert stage(loop, getitem, user, pil_open) == "read"
    assert stage(loop, getitem, user) == "your __getitem__"
    assert stage(loop, get) == "waiting for work"
    assert stage(loop, _frame("/p/engine/instrument/probes.py", "TimedCollate.__call__")) == \
        "collate"
    assert stage(_frame("/usr/lib/python3/threading.py", "Thread.run"),
                 _frame("/usr/lib/python3/multiprocessing/queues.py", "Queue._feed"),
                 role="QueueFeederThread") == "hand-off"
    assert stage(_frame("/home/u/train.py", "train"), role="main") == "not the loader"
    # the pin-memory thread, charged by its name (its frames are not walked): GPU machines only
    assert stage(role="Thread-3 (_pin_memory_loop)") == "pinning"


@pytest.mark.host_speed  # sampled shares against the known make-up
@pytest.mark.slow
def test_a_tune_says_where_its_trials_time_went():
    """Every trial's processes sampled (0 workers: the main one; then the workers), merged into
    the tune's result, as the CLI prints it after the reasons."""
    handle = run_to_completion(RunRequest(target=dataset_path("known_stages.py"), kind="tune",
                                          budget_s=40.0))
    result = handle.live.tune_result(handle.state.value)
    assert result.status == "ok", result.error
    stacks = result.stacks
    assert stacks["enough"] and stacks["processes"] >= 2
    found = {h["function"]: h["total_share"] for h in stacks["hotspots"]
             if h["function"] in FUNCTIONS}
    total = sum(found.values())
    for name, known in known_stages.SHARES.items():
        assert found[name] / total == pytest.approx(known, abs=0.1), found
    assert result.to_dict()["stacks"]["stages"][0]["stage"] == "your __getitem__"


def test_a_watched_loader_says_where_its_workers_time_went(tmp_path):
    """watch(loader): the workers sample themselves and send their stacks with their batches;
    the job's run keeps them (the history's events), and its result says where time went."""
    from dataloader_tuner import watch
    from dataloader_tuner.instrument import sampler

    loader = watch(DataLoader(known_stages.KnownStages(), batch_size=8, num_workers=2),
                   db=str(tmp_path / "runs.sqlite"))
    try:
        for epoch in range(2):
            for i, _ in enumerate(loader):
                if i >= 120:
                    break
    finally:  # (a loader left watched would have later tests' workers sample themselves)
        result = loader.close()
    assert sampler.running() is None  # the job's process is not sampled once it ends
    assert result.stacks_sampled["enough"] and result.stacks_sampled["processes"] >= 2
    # A short job (~250 looks): each function found, the largest first; the shares' agreement
    # is checked on longer runs above (a CI run saw decode at 0.63 here)
    shares = _shares_of(result)
    assert all(shares[name] > 0.05 for name in FUNCTIONS), shares
    assert max(shares, key=shares.get) == "decode_sample", shares


@pytest.mark.slow  # a fresh interpreter importing torch (~1.6 s)
def test_a_process_left_sampling_ends_normally():
    """The interpreter's end puts SIGPROF back to its default (ending the process): a sampler
    never stopped must be disarmed first (a watched job died at exit of "Profiling timer
    expired" before)."""
    import subprocess
    import sys

    code = ("from dataloader_tuner.instrument.sampler import StackSampler\n"
            "s = StackSampler(0.001).start()\n"
            "assert s is not None\n"
            "total = sum(range(3 * 10 ** 6))\n"
            "import torch\n")  # (a large module's teardown: a long finalisation)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-500:]


def test_the_text_says_what_the_profile_rests_on_and_what_sampling_cost():
    from dataloader_tuner.analyse.text import sampled_basis, stacks_text

    seen = {"looks": 594, "seconds": 5.2, "processes": 5, "enough": True,
            "sampling_share": 0.0041}
    assert sampled_basis(seen) == ("594 looks over 5.2 s of work in 5 process(es); sampling "
                                   "took 0.41% of it")
    stages = [{"stage": "decode", "share": 0.8, "cpu_share": 0.8}]
    assert stacks_text(seen, stages, [])[0].startswith(f"where the time goes ({sampled_basis(seen)})")
    older = {k: v for k, v in seen.items() if k != "sampling_share"}  # a run saved before
    assert "sampling took" not in sampled_basis(older)
    assert "too few samples" in stacks_text({**seen, "enough": False}, stages, [])[0]


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def step_of_the_job(seconds: float) -> None:
    _spin(seconds)


def receiving_a_batch(seconds: float) -> None:
    _spin(seconds)


def test_a_job_s_own_process_is_sampled_only_inside_the_loader_s_next():
    """The window (sampler.NEXT_WINDOW, set around each next() by record/ledger.py): a job
    spending 3 parts of its CPU in its step and 1 inside next() is charged the 1 part, and
    its step is never looked at."""
    from dataloader_tuner.instrument.sampler import NEXT_WINDOW

    sampler = StackSampler(interval_s=0.002, window=NEXT_WINDOW).start()
    assert sampler is not None
    try:
        # Periods that are no whole number of the kernel's tick: a process's CPU timer fires
        # only at a tick (4 ms at HZ=250), so 15 + 5 ms steps were seen at the same two
        # points of each, twice a window or once by chance (CI: 0.32 s charged)
        for _ in range(40):
            step_of_the_job(0.0137)
            # as record/ledger.py around next(), on this (the main) thread
            NEXT_WINDOW.since, NEXT_WINDOW.thread = time.monotonic(), threading.get_ident()
            try:
                receiving_a_batch(0.0051)
            finally:
                NEXT_WINDOW.since = None
    finally:
        sampler.stop()
    sampled = sampler.take()
    seen = {f[2] for _, frames, _, _, _ in sampled for f in frames}
    assert "receiving_a_batch" in seen and "step_of_the_job" not in seen, seen
    charged = sum(wall for role, _, _, wall, _ in sampled if role == "main")
    assert charged == pytest.approx(40 * 0.0051, rel=0.35), charged  # not the step's 0.55 s
    # a next() on another thread: the main thread's frame is not in it, nothing is looked at
    other = StackSampler(interval_s=0.002, window=NEXT_WINDOW).start()
    assert other is not None
    try:
        NEXT_WINDOW.since, NEXT_WINDOW.thread = time.monotonic(), -1
        step_of_the_job(0.1)
    finally:
        NEXT_WINDOW.since = None
        other.stop()
    assert other.looks == 0


HAND_OFF_JOB = """
import json, sys, time
import torch
from torch.utils.data import DataLoader, Dataset
from dataloader_tuner import watch
from dataloader_tuner.instrument import sampler

class ManyTensors(Dataset):
    def __len__(self):
        return 10_000
    def __getitem__(self, index):
        return [torch.full((4,), float(index)) for _ in range(16)]

def step_of_the_job(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

def main():
    loader = watch(DataLoader(ManyTensors(), batch_size=8, num_workers=2,
                              collate_fn=lambda samples: [t for s in samples for t in s]),
                   db=sys.argv[1])
    try:
        for i, _ in enumerate(loader):
            step_of_the_job(0.002)
            if i >= 100:
                break
    finally:
        result = loader.close()
    print(json.dumps({"running": sampler.running() is not None, "hotspots": result.hotspots}))

# A trainer's callers above its loop (a Lightning fit has dozens): functions of their own
CALLERS = 25
source = "\\n".join(f"def caller_{i}():\\n    return caller_{i + 1}()" for i in range(CALLERS))
scope = {"main": main}
exec(source + f"\\ndef caller_{CALLERS}():\\n    return main()", scope)
scope["caller_0"]()
"""


@pytest.mark.slow  # ~5 s: each small tensor crosses with its own file descriptor
def test_a_watched_loader_s_main_process_shows_its_hand_off(tmp_path):
    """watch(loader) with 2 workers whose batches are 128 small tensors each (costly to
    rebuild in the main process): the job's own process is sampled inside next() and its
    rebuilding shows as the hand-off; its step is not looked at, nor the 25 functions the loop
    runs under (a trainer's callers: under pytest the loop's ~18 callers, each in every look,
    held nearly all of the top functions, and once in CI the rebuilding was not among them)."""
    import subprocess

    script = tmp_path / "job.py"
    script.write_text(HAND_OFF_JOB)
    job = subprocess.run([sys.executable, str(script), str(tmp_path / "runs.sqlite")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert job.returncode == 0, job.stderr[-3000:]
    printed = json.loads(job.stdout.strip().splitlines()[-1])
    assert not printed["running"]
    hotspots = printed["hotspots"]
    main = [h for h in hotspots if h["stage"] == "hand-off"]
    assert main and any("rebuild" in h["function"] or "loads" in h["function"]
                        or "Queue.get" in h["function"] for h in main), hotspots
    assert not any("step_of_the_job" in h["function"] or "caller_" in h["function"]
                   for h in hotspots), hotspots


def test_a_job_that_puts_the_signals_back_is_not_ended_by_the_sampler():
    """A sampler running while the job sets its timer's signal back to the default (as
    Lightning's trainer does for every signal as a fit ends): the process goes on and ends
    normally (cpu_timer.py: the timer's signal is one whose default is to be ignored)."""
    import subprocess
    import sys

    code = ("import signal, time\n"
            "from dataloader_tuner.instrument.sampler import StackSampler\n"
            "s = StackSampler(0.001).start()\n"
            "assert s is not None\n"
            "signal.signal(s.timer.signum, signal.SIG_DFL)\n"
            "end = time.thread_time() + 0.3\n"
            "while time.thread_time() < end:\n"
            "    pass\n"
            "print('alive')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert done.returncode == 0 and b"alive" in done.stdout, done.stderr.decode()[-500:]


class Compose:
    """torchvision's Compose loop, as the sampler meets it."""

    def __init__(self, transforms) -> None:
        self.transforms = transforms

    def __call__(self, image):
        for t in self.transforms:
            image = t(image)
        return image


class Normalize:
    """Ends in operators: it returns before the interpreter next checks for a signal."""

    def __call__(self, x):
        Normalize.caller = sys._getframe(1)  # the Compose's frame, kept to look at after
        return (x - 1.0) / 2.0


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 3.0


def test_a_look_on_the_compose_s_loop_is_charged_to_the_step_it_just_called():
    """NOTE [ A step seen after it returned ]: the Compose's frame as a look after a step's
    return finds it; its step put back as the leaf, by its class (an nn.Module's forward)."""
    from dataloader_tuner.instrument.frames import read_stack as _stack

    Compose([Scale(), Normalize()])(torch.ones(2))
    stack = _stack(Normalize.caller)
    assert stack[0] is Normalize.__call__.__code__ and stack[1].co_name == "__call__"
    assert stage_of("main", named(stack) + ((WORK_FILE_PATH, 1, "TimedMapDataset.__getitems__",
                                             1),)) == "transform: Normalize"

    class LastCompose(Compose):
        def __call__(self, image):
            for t in self.transforms:
                image = t(image)
            Normalize.caller = sys._getframe()
            return image

    LastCompose([Normalize(), Scale()])(torch.ones(2))
    assert _stack(Normalize.caller)[0] is Scale.forward.__code__
