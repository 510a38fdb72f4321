"""The command line: ``dataloader-tuner`` / ``python -m dataloader_tuner``. main.py parses and
dispatches; each command is a module of commands/ behind the small Command interface."""
