#!/usr/bin/env bash
# Type-checks the package as users import it (dataloader_tuner), with the settings in
# pyproject.toml: strict on the seams (protocol, record.rows, analyse, tune), mypy's defaults
# elsewhere. mypy cannot follow setuptools' package-dir mapping, so the checkout's folders are
# linked into a package-shaped tree under build/ first; errors are reported at the files here.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/typecheck
rm -rf "$tree" && mkdir -p "$tree/dataloader_tuner"
for entry in engine/*; do
  case "$entry" in *__pycache__) continue ;; esac
  ln -s "$PWD/$entry" "$tree/dataloader_tuner/$(basename "$entry")"
done
ln -s "$PWD/dashboard" "$tree/dataloader_tuner/dashboard"
cd "$tree"
python3 -m mypy --config-file ../../pyproject.toml --cache-dir ../mypy-cache -p dataloader_tuner "$@" \
  | sed -e 's#^dataloader_tuner/dashboard/#dashboard/#' -e 's#^dataloader_tuner/#engine/#'
