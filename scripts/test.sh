#!/usr/bin/env bash
# The whole test suite: formatting, lint, types, tests (with doctests and the
# docs' examples), and a strict docs build. Run from the repository root:
#     uv run --frozen --all-packages bash scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== ruff format --check"
ruff format --check .
echo "== ruff check"
ruff check .
echo "== pyright"
pyright
echo "== pytest"
python -m pytest -n 2 -q "$@"
echo "== mkdocs build --strict"
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$(mktemp -d)"
