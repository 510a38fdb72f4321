"""One line for the trainers that build the DataLoader themselves: the Hugging Face Trainer
(``watch_trainer``) here, Lightning's callback in dataloader_tuner.lightning, accelerate's
prepared loader in ``watch`` itself (loader.py).

Each watches the loaders the trainer builds inside the objects it keeps (attach.py), one run per
role ("train", "eval"): a loader built again for the same role (an evaluation loader made anew at
each evaluation) goes on in the same run.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from dataloader_tuner.store import RunStore
from dataloader_tuner.watcher.attach import attach_blocker, attached, inner_loader
from dataloader_tuner.watcher.frameworks import HF_TRAINER
from dataloader_tuner.watcher.loader import WatchedLoader, _say
from dataloader_tuner.watcher.rank_identity import RankIdentity


class RoleWatch:
    """The runs of one trainer's loaders, one per role, each following the loader the trainer
    built last for it."""

    def __init__(self, framework: str, db: str | None, tune_roles: set[str],
                 max_workers: int | None, rank: RankIdentity | None = None) -> None:
        self.framework, self.tune_roles, self.max_workers = framework, tune_roles, max_workers
        self.rank = rank  # where the launcher does not say it as torchrun does
        self.store = RunStore(db)
        self.runs: dict[str, WatchedLoader | None] = {}  # None: said why not

    def follow(self, role: str, built: Any, ahead: bool = False) -> None:
        """Watch ``built`` (what the trainer holds: a DataLoader, accelerate's wrapper) as
        ``role``; ``ahead``: the trainer asks it for one batch ahead of the loop (accelerate's
        wrapper is known to). Never raises into the training job."""
        try:
            inner = inner_loader(built)
            loader = inner if inner is not None else built
            why_not = attach_blocker(loader)
            if why_not is not None:
                if role not in self.runs:
                    self.runs[role] = None
                    _say(f"{role}: not watched ({why_not})")
                return
            if attached(loader):  # the same loader again (kept for persistent workers)
                return
            run = self.runs.get(role)
            if run is None:
                self.runs[role] = WatchedLoader(
                    loader, role, self.store, tune=role in self.tune_roles,
                    max_workers=self.max_workers, in_place=True, framework=self.framework,
                    ahead=ahead or inner is not None, rank=self.rank)
            else:
                run.follow(loader)
        except Exception as exc:  # noqa: BLE001 - never the training job's problem
            _say(f"{role}: not watched ({type(exc).__name__}: {exc}); training goes on")

    def close(self, status: str = "ok", error: dict | None = None) -> None:
        """End every role's run now (the trainer is done: a notebook's process goes on); the
        loaders get their own iterators back. A later loader starts new runs."""
        runs, self.runs = self.runs, {}
        for run in runs.values():
            if run is not None:
                run.close(status, error)


def watch_trainer(trainer: Any, tune: bool = False, db: str | None = None,
                  max_workers: int | None = None) -> Any:
    """Watch the loaders a Hugging Face ``Trainer`` builds, from one line after making it::

        trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val)
        dataloader_tuner.watch_trainer(trainer)
        trainer.train()

    Its training loader is watched as "train" and each evaluation's as "eval" (or the name of
    the eval dataset), with the full figures (workers, fetch, collate, input wait with each
    epoch's start-up), under ``torchrun`` and ``accelerate launch`` too (each rank its run).
    ``tune=True`` tunes the training loader in place (loader.py); its choice is given as the
    ``TrainingArguments`` fields to set. The runs end with ``train()``. Returns the trainer."""
    roles = RoleWatch(HF_TRAINER, db, {"train"} if tune else set(), max_workers)

    def watching(build: Callable[..., Any], role_of: Callable[..., str]) -> Callable[..., Any]:
        @functools.wraps(build)
        def built(*args: Any, **kwargs: Any) -> Any:
            loader = build(*args, **kwargs)
            roles.follow(role_of(*args, **kwargs), loader)
            return loader
        return built

    def eval_role(eval_dataset: Any = None, *args: Any, **kwargs: Any) -> str:
        return eval_dataset if isinstance(eval_dataset, str) else "eval"

    trainer.get_train_dataloader = watching(trainer.get_train_dataloader, lambda *a, **k: "train")
    trainer.get_eval_dataloader = watching(trainer.get_eval_dataloader, eval_role)
    trainer.add_callback(_end_runs_callback(roles))
    trainer._dataloader_tuner = roles  # kept with the trainer, for its runs to be found
    return trainer


def _end_runs_callback(roles: RoleWatch) -> Any:
    """A TrainerCallback ending the runs with ``train()`` (a notebook's process goes on; a later
    ``evaluate()`` starts a new run)."""
    from transformers import TrainerCallback  # the job's own: it made the trainer

    class EndRuns(TrainerCallback):
        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            roles.close()

    return EndRuns()
