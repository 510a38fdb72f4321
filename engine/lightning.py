"""Lightning in one line: its loaders watched by a Callback.

    from dataloader_tuner.lightning import WatchLoaders

    trainer = L.Trainer(max_epochs=10, callbacks=[WatchLoaders()])
    trainer.fit(model, datamodule=data)

Lightning asks the LightningModule or DataModule for its loaders, then prepares each for the
run: under DDP it builds it again with a DistributedSampler (a new DataLoader object), and
makes each epoch's iterator itself. The callback takes each loader as Lightning has prepared it
(the trainer's data connector's ``_prepare_dataloader``, on this trainer only) and watches it
inside that very object (watcher/attach.py), one run per role: "train", "val" (a second val
loader "val_1"), "test", "predict". Each rank of a DDP job is a rank of the job's view, whether
Lightning launched it or torchrun did. The runs end when the trainer's stage does (``teardown``),
which in a notebook is long before the process ends.

``WatchLoaders(tune=True)`` tunes the training loader in place; its choice is given as the
DataLoader(...) line to put in the DataModule's ``train_dataloader``.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Any, Callable

from dataloader_tuner.watcher.frameworks import LIGHTNING
from dataloader_tuner.watcher.loader import _say
from dataloader_tuner.watcher.shutdown import failed_with
from dataloader_tuner.watcher.rank_identity import RankIdentity, rank_identity
from dataloader_tuner.watcher.trainers import RoleWatch


def _callback_base() -> type:
    """Lightning's Callback class, from the package the job uses: ``lightning`` (with
    ``lightning.pytorch``) or the older ``pytorch_lightning``, whichever it has imported."""
    prefer_old = "pytorch_lightning" in sys.modules and "lightning" not in sys.modules
    for package in (["pytorch_lightning", "lightning.pytorch"] if prefer_old
                    else ["lightning.pytorch", "pytorch_lightning"]):
        try:
            return importlib.import_module(package).Callback
        except ImportError:
            continue
    raise ImportError("dataloader_tuner.lightning needs Lightning: pip install lightning "
                      "(or the older pytorch-lightning)")


# The loops whose setup_data asks for loaders: each setup numbers its loaders from 0.
_LOOPS = ("fit_loop", "fit_loop.epoch_loop.val_loop", "validate_loop", "test_loop",
          "predict_loop")


class WatchLoaders(_callback_base()):  # type: ignore[misc]  # Lightning's, found at import
    """Watches the loaders a Lightning Trainer runs (the module's docstring says how)."""

    def __init__(self, tune: bool = False, db: str | None = None,
                 max_workers: int | None = None) -> None:
        super().__init__()
        self.tune, self.db, self.max_workers = tune, db, max_workers
        self.roles: RoleWatch | None = None  # made in each process that trains (DDP spawns)
        self._numbered: dict[str, int] = {}  # loaders of each stage seen in this setup

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if getattr(trainer, "_dataloader_tuner", None) is self:
            return  # hooked already (a second fit, a test after it)
        try:
            prepare = trainer._data_connector._prepare_dataloader
            loops = [_attribute(trainer, path) for path in _LOOPS]
        except AttributeError as exc:
            _say(f"Lightning's loaders: not watched (this Lightning version has no {exc.name}: "
                 "the versions tested are in requirements-test.txt); training goes on")
            return
        try:
            self.roles = RoleWatch(LIGHTNING, self.db, {"train"} if self.tune else set(),
                                   self.max_workers, rank=_rank_of(trainer))
        except Exception as exc:  # noqa: BLE001 - e.g. an unwritable history: train unwatched
            _say(f"Lightning's loaders: not watched ({type(exc).__name__}: {exc}); training "
                 "goes on")
            return
        trainer._data_connector._prepare_dataloader = self._following(prepare)
        for loop in loops:
            loop.setup_data = self._numbering(loop.setup_data)
        trainer._dataloader_tuner = self

    def _following(self, prepare: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(prepare)
        def prepared(dataloader: Any, shuffle: bool, mode: Any) -> Any:
            loader = prepare(dataloader, shuffle=shuffle, mode=mode)
            prefix = getattr(mode, "dataloader_prefix", None) or "loader"
            index = self._numbered.get(prefix, 0)
            self._numbered[prefix] = index + 1
            if self.roles is not None:
                # Lightning asks an unsized loader one batch ahead, to know the last (fetchers.py)
                self.roles.follow(prefix if index == 0 else f"{prefix}_{index}", loader,
                                  ahead=not _sized(loader))
            return loader
        return prepared

    def _numbering(self, setup_data: Callable[[], None]) -> Callable[[], None]:
        @functools.wraps(setup_data)
        def numbered() -> None:
            self._numbered = {}
            setup_data()
        return numbered

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.roles is not None:
            self.roles.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.roles is None:
            return
        if isinstance(exception, KeyboardInterrupt):
            self.roles.close("stopped")
            return
        self.roles.close("error", failed_with(exception))


def _attribute(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def _sized(loader: Any) -> bool:
    try:
        len(loader)
    except TypeError:
        return False
    return True


def _rank_of(trainer: Any) -> RankIdentity | None:
    """This process's place in a DDP job: torchrun's word where it launched the job, else the
    trainer's (Lightning's own launcher sets no RANK)."""
    if trainer.world_size <= 1:
        return None
    told = rank_identity()
    if told is not None:
        return told
    return RankIdentity(
        rank=trainer.global_rank, world_size=trainer.world_size, local_rank=trainer.local_rank,
        local_world_size=trainer.num_devices, node_rank=trainer.node_rank,
        # the address the job's process group was made at: the same on every rank
        job_id=f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}")


__all__ = ["WatchLoaders"]
