#!/usr/bin/env bash
# The whole test suite. Run from the repository root:
#     uv run --frozen --all-packages bash scripts/test.sh [pytest arguments]
#
# 1. ruff format --check, ruff check, pyright, pytest (with the docs' and
#    docstrings' examples) and a strict docs build, on the current interpreter;
# 2. pytest on every other supported CPython, each in its own venv
#    (.venvs/pyX.Y) synced from the same uv.lock;
# 3. pytest at the lowest versions the packages declare (uv's
#    `--resolution lowest-direct`), locked in a scratch copy of the tree.
#
# Interpreters are looked for (scripts/find_python.sh), never downloaded:
# outside CI a missing one is reported and skipped, with CI=true it fails the
# run. The last lines say how long each part took.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

# Every CPython the packages support (the classifiers list the same ones).
SUPPORTED_PYTHONS="3.11 3.12 3.13"
# The floors are to be tested on the oldest and the newest of them ("3.11 3.13":
# the versions a floor resolves to differ, NumPy 1.26 has no wheels for 3.13, and
# old releases break first on the newest Python). Switched off for now: with the
# orbax package, the display, docs-site and recompile features merged, the run at
# the floors (JAX 0.6.0, orbax-checkpoint 0.12.0, hypothesis 6.100 and the docs
# tools' floors) fails 17 tests; the floors must be raised to the truth first
# (issue 14 stays open until this line reads "3.11 3.13" again).
LOWEST_PYTHONS=""
# The lowest resolution ignores uploads after this date, so it picks the same
# versions (transitive dependencies included) until the date is moved.
LOWEST_EXCLUDE_NEWER="2026-11-23T00:00:00Z"

export UV_PYTHON_DOWNLOADS=never
TIMINGS=()
SKIPPED=()
SUITE_START=$SECONDS

report() {
    local status=$? line
    echo "== timings (seconds)"
    for line in "${TIMINGS[@]}"; do echo "   $line"; done
    printf '   %-48s %5d\n' "total" $((SECONDS - SUITE_START))
    for line in "${SKIPPED[@]}"; do echo "   SKIPPED: $line"; done
    if ((status != 0)); then echo "== FAILED (exit status $status)"; fi
}
trap report EXIT

step() {  # step NAME COMMAND...: run one part of the suite, timed
    local name=$1 start=$SECONDS
    shift
    echo "== $name"
    "$@"
    TIMINGS+=("$(printf '%-48s %5d' "$name" $((SECONDS - start)))")
}

in_venv() {  # in_venv VENV COMMAND...: run a command as if VENV were activated
    local venv=$1
    shift
    env PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" "$@"
}

# Find every interpreter before the long parts, so CI fails at once.
CURRENT=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
declare -A PYTHON_AT=()
for version in $SUPPORTED_PYTHONS $LOWEST_PYTHONS; do
    [[ -n "${PYTHON_AT[$version]:-}" ]] && continue
    if [[ "$version" == "$CURRENT" ]]; then
        PYTHON_AT[$version]=$(python -c 'import sys; print(sys._base_executable)')
    elif found=$(bash scripts/find_python.sh "$version"); then
        PYTHON_AT[$version]=$found
    elif (($? == 2)); then
        SKIPPED+=("Python $version: no interpreter found")
        PYTHON_AT[$version]=""
    else
        exit 1
    fi
done

step "ruff format --check" ruff format --check .
step "ruff check" ruff check .
step "pyright" pyright
step "pytest, Python $CURRENT (uv.lock)" python -m pytest -n 2 -q "$@"
step "mkdocs build --strict" \
    env NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "$(mktemp -d)"

for version in $SUPPORTED_PYTHONS; do
    [[ "$version" != "$CURRENT" && -n "${PYTHON_AT[$version]}" ]] || continue
    venv="$ROOT/.venvs/py$version"
    step "sync .venvs/py$version (uv.lock)" \
        env -u VIRTUAL_ENV UV_PROJECT_ENVIRONMENT="$venv" \
        uv sync --frozen --all-packages --quiet --python "${PYTHON_AT[$version]}"
    step "pytest, Python $version (uv.lock)" in_venv "$venv" python -m pytest -n 2 -q "$@"
done

# uv.lock stays untouched: the lowest resolution is locked in a copy of the tree
# (tracked and new files, as they are now) under .venvs/lowest. That lock is
# kept between runs, so an unchanged tree resolves to the same versions.
SCRATCH="$ROOT/.venvs/lowest"
copy_tree() {
    rm -rf "$SCRATCH/tree"
    mkdir -p "$SCRATCH/tree"
    git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do if [[ -e "$f" ]]; then printf '%s\0' "$f"; fi; done \
        | tar -c --null -T - -f - | tar -x -C "$SCRATCH/tree" -f -
    rm -f "$SCRATCH/tree/uv.lock"
    if [[ -f "$SCRATCH/uv.lock" ]]; then cp "$SCRATCH/uv.lock" "$SCRATCH/tree/uv.lock"; fi
}
lock_lowest() (
    cd "$SCRATCH/tree"
    env -u VIRTUAL_ENV uv lock --quiet --resolution lowest-direct \
        --exclude-newer "$LOWEST_EXCLUDE_NEWER"
    cp uv.lock "$SCRATCH/uv.lock"
)
sync_lowest() (  # sync_lowest X.Y
    cd "$SCRATCH/tree"
    env -u VIRTUAL_ENV UV_PROJECT_ENVIRONMENT="$SCRATCH/py$1" \
        uv sync --frozen --all-packages --quiet --python "${PYTHON_AT[$1]}"
    "$SCRATCH/py$1/bin/python" -c '
from importlib.metadata import version
names = "jax jaxlib numpy typing_extensions pluggy hypothesis optree jaxtyping beartype pytest"
print("   at", ", ".join(f"{n} {version(n)}" for n in names.split()))'
)
pytest_lowest() (  # pytest_lowest X.Y [pytest arguments]
    cd "$SCRATCH/tree"
    venv="$SCRATCH/py$1"
    shift
    in_venv "$venv" python -m pytest -n 2 -q "$@"
)

LOWEST_TODO=()
for version in $LOWEST_PYTHONS; do
    if [[ -n "${PYTHON_AT[$version]}" ]]; then LOWEST_TODO+=("$version"); fi
done
if ((${#LOWEST_TODO[@]})); then
    step "copy the tree to .venvs/lowest" copy_tree
    step "lock lowest-direct" lock_lowest
    for version in "${LOWEST_TODO[@]}"; do
        step "sync .venvs/lowest/py$version (lowest-direct)" sync_lowest "$version"
        step "pytest, Python $version (lowest-direct)" pytest_lowest "$version" "$@"
    done
fi
