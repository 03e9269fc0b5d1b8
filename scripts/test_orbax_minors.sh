#!/usr/bin/env bash
# tests/orbax against the newest release of each of orbax-checkpoint's two newest
# minor versions (default 0.12 and 0.11; pass others as arguments). Run from the
# repository root:
#     bash scripts/test_orbax_minors.sh [MINOR ...]
#
# jaxstruct-orbax reads arrays through orbax internals (its _orbax_internals
# module) and pins orbax-checkpoint below the next minor; this is how a new minor
# is vetted before the pin moves, and how CI checks the previous one still works.
# Each minor gets a scratch venv (.venvs/orbax-MINOR) with every workspace package
# installed editable and orbax-checkpoint overridden to that minor (an override, so
# a minor below the declared floor can be tried too). uv.lock is not touched.
set -euo pipefail
cd "$(dirname "$0")/.."
minors=("$@")
if [ ${#minors[@]} -eq 0 ]; then
    minors=(0.12 0.11)
fi
packages=()
for dir in packages/*/; do
    packages+=(-e "$dir")
done
for minor in "${minors[@]}"; do
    venv=".venvs/orbax-$minor"
    override="$(mktemp)"
    echo "orbax-checkpoint==$minor.*" >"$override"
    env -u VIRTUAL_ENV uv venv --quiet --allow-existing --python 3.11 "$venv"
    VIRTUAL_ENV="$venv" uv pip install --quiet --override "$override" "${packages[@]}" \
        pytest pytest-xdist hypothesis
    rm -f "$override"
    version="$("$venv/bin/python" -c 'import orbax.checkpoint as o; print(o.__version__)')"
    echo "[test_orbax_minors] orbax-checkpoint $version"
    "$venv/bin/python" -m pytest tests/orbax -q -p no:cacheprovider
done
