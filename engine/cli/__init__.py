"""``python -m engine`` and the ``dataloader-tuner`` command."""
