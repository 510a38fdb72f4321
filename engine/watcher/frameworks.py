"""The trainers that build a watched loader, as the run names them, and the settings in the form
each takes them: the Hugging Face Trainer's ``TrainingArguments`` fields, else the DataLoader
keywords (a DataModule's, accelerate's loader). The one-line hooks are in trainers.py."""

from __future__ import annotations

from dataloader_tuner.config import LoaderConfig

HF_TRAINER = "Hugging Face Trainer"
ACCELERATE = "accelerate"
LIGHTNING = "Lightning"
RAY_TRAIN = "Ray Train"

# TrainingArguments' field for each DataLoader setting the tuner recommends.
TRAINING_ARGUMENTS = {"num_workers": "dataloader_num_workers",
                      "pin_memory": "dataloader_pin_memory",
                      "prefetch_factor": "dataloader_prefetch_factor",
                      "persistent_workers": "dataloader_persistent_workers"}


def snippet(framework: str | None, config: LoaderConfig) -> str:
    """The settings as the user sets them under ``framework``: TrainingArguments fields for the
    Hugging Face Trainer, else the DataLoader(...) line (a DataModule's, accelerate's loader)."""
    if framework != HF_TRAINER:
        return config.snippet()
    values = {"num_workers": config.num_workers, "pin_memory": config.pin_memory,
              "prefetch_factor": config.prefetch_factor if config.num_workers else None,
              "persistent_workers": bool(config.persistent_workers and config.num_workers)}
    fields = ", ".join(f"{TRAINING_ARGUMENTS[key]}={value!r}" for key, value in values.items())
    return f"TrainingArguments(..., {fields})"
