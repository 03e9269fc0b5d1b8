#!/usr/bin/env bash
# The whole test suite. Run from the repository root:
#     uv run --frozen --all-packages bash scripts/test.sh [pytest arguments]
#
# (The default dependency groups are dev and peers: peers installs optax, flax, chex and
# equinox, against which the tests of other libraries' pytrees and of what the docs
# say about them run; those runs fail rather than skip when a peer is missing.)
#
# 1. ruff format --check, ruff check, pyright, pytest (with the docs' and
#    docstrings' examples) and a strict docs build, on the current interpreter;
# 2. pytest on every other supported CPython, each in its own venv
#    (.venvs/pyX.Y) synced from the same uv.lock;
# 3. pytest at the lowest versions the packages declare (uv's
#    `--resolution lowest-direct`), locked in a scratch copy of the tree: once
#    with every package, and once without jaxstruct-orbax, whose JAX floor is
#    above the other layers' (there the orbax tests are skipped, by name; and on
#    the Pythons where both run, the run with it runs only the orbax tests).
#
# Some test modules check the project's tooling rather than the packages, and
# run once, in part 1, on the current interpreter: the built docs site in a
# browser (tests/test_site.py: the same HTML whichever Python builds it), the
# built distributions installed in a fresh venv (tests/test_release.py), and
# the benchmark harnesses (tests/test_benchmarks.py, tests/test_bench_debug.py,
# tests/test_bench_replace.py: benchmarks run at uv.lock's versions, where
# their targets are set, in fresh processes that take most of their time). The
# other runs leave them out with pytest's --ignore, so their summaries' counts
# say so.
#
# Interpreters are looked for (scripts/find_python.sh), never downloaded:
# outside CI a missing one is reported and skipped, with CI=true it fails the
# run. The last lines say how long each part took.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

# Every CPython the packages support (the classifiers list the same ones).
SUPPORTED_PYTHONS="3.11 3.12 3.13"
# The floors are tested on the oldest and the newest of them: the versions a floor
# resolves to differ (NumPy 1.26 has no wheels for 3.13), and old releases break
# first on the newest Python.
LOWEST_PYTHONS="3.11 3.13"
# On these, the floors run with jaxstruct-orbax runs only the tests that need it
# (JAXSTRUCT_TEST_ONLY_ORBAX=1, tests/conftest.py): the run without it below tests
# everything else there at the other layers' lower floors.
LOWEST_ONLY_ORBAX_PYTHONS="3.11"
# The floors once more without jaxstruct-orbax (its JAX floor, 0.7.1, is above the
# other layers' 0.4.36, so the run above never reaches theirs): on the oldest
# Python only, where the oldest JAX and NumPy resolve; it keeps CI near 15 minutes.
LOWEST_CORE_PYTHONS="3.11"
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
for version in $SUPPORTED_PYTHONS $LOWEST_PYTHONS $LOWEST_CORE_PYTHONS; do
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

# The runs at uv.lock's versions have the peers (optax, flax, equinox) installed and
# must run their tests; the lowest-versions runs below do not install them (their
# floors would lift JAX's above the layers' own).
export JAXSTRUCT_TEST_PEERS=1
# What the runs after the first leave out (see the header).
TOOLING=(--ignore=tests/test_site.py --ignore=tests/test_release.py
    --ignore=tests/test_benchmarks.py --ignore=tests/test_bench_debug.py
    --ignore=tests/test_bench_replace.py)
# Two slow end-to-end runs also run once, in part 1 (to keep CI within 20
# minutes on 2 cores): the S3 and GCS tests, which start moto's and
# fake-gcs-server's processes and run the orbax format against them (about 30 s
# a run; what they check is the servers' protocol, not the interpreter), and
# the property-testing example, a pytest run of examples/property_testing in a
# subprocess (about 20 s a run, one worker); and the type checkers' tests
# (tests/test_typing.py), where pyright checks our classes as Python 3.11 and 3.13
# see them in one run.
FIRST_ONLY=(--ignore=tests/orbax/test_object_store.py
    --deselect=tests/orbax/test_multiprocess.py::test_two_processes_save_to_an_object_store_and_restore
    --ignore=tests/testing/test_property_example.py
    --ignore=tests/test_typing.py)
# Sweeps and end-to-end runs of jaxstruct's own byte logic, kill safety and host
# memory also run once, in part 1: every single-bit flip of a file's metadata, every
# byte of a small file flipped, a writer killed at every step, racing writers, and the
# host budget's bytes in flight and process growth. What they check (our bytes on
# disk, the OS's files, glibc's allocator) is the same whichever CPython or
# dependency versions run them, and together they took 150 s of a worker's time per
# run (pytest --durations on CPython 3.12, 2026-12-07): about 75 s of each later run.
ONCE=(--ignore=tests/io/test_host_streaming.py --ignore=tests/io/test_host_budget.py
    --ignore=tests/safetensors/test_host_budget.py --ignore=tests/safetensors/test_marks.py
    --ignore=tests/orbax/test_marks.py
    --deselect=tests/io/test_library_trust.py::test_every_single_bit_flip_of_the_manifest_is_refused_or_harmless
    --deselect=tests/safetensors/test_checksums.py::test_a_flipped_byte_anywhere_is_found_never_loaded
    --deselect=tests/orbax/test_checksums.py::test_a_flipped_byte_in_any_stored_file_is_found_never_loaded
    --deselect=tests/orbax/test_checksums.py::test_a_forked_writer_killed_at_each_step_keeps_a_loadable_checkpoint
    --deselect=tests/io/test_atomic.py::test_kill_at_every_step_boundary_keeps_a_checkpoint
    --deselect=tests/io/test_reliability.py::test_racing_overwrites_to_a_new_path_both_succeed)
# The later runs also draw fewer Hypothesis examples (the "repeat" profile of
# tests/conftest.py: 15 instead of 40): they look for what another interpreter or
# another dependency version breaks, which the first examples show.
REPEAT_PROFILE=repeat
# The other Pythons at uv.lock's versions also leave out the end-to-end runs of
# several processes of one script, which check the processes' coordination and
# the file system, the same whichever CPython runs them: the two-process
# orbax runs (JAX's distributed client; they also run at the floors, where
# orbax's oldest release is) and the training example killed and resumed
# (about 60 s a run together). The fork tests, where CPython's own behaviour
# differs between versions, run everywhere.
OTHER_PYTHONS_LEAVE_OUT=(--ignore=tests/orbax/test_multiprocess.py
    --ignore=tests/io/test_train_resume.py)
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
    step "pytest, Python $version (uv.lock)" in_venv "$venv" \
        env HYPOTHESIS_PROFILE="$REPEAT_PROFILE" python -m pytest -n 2 -q \
        "${TOOLING[@]}" "${FIRST_ONLY[@]}" "${ONCE[@]}" "${OTHER_PYTHONS_LEAVE_OUT[@]}" "$@"
done

# uv.lock stays untouched: each lowest resolution is locked in a copy of the tree
# (tracked and new files, as they are now) under .venvs/lowest (every package) or
# .venvs/lowest-core (without jaxstruct-orbax). Its lock is kept between runs, so
# an unchanged tree resolves to the same versions.
copy_tree() (  # copy_tree SCRATCH
    scratch=$1
    rm -rf "$scratch/tree"
    mkdir -p "$scratch/tree"
    git ls-files -z --cached --others --exclude-standard \
        | while IFS= read -r -d '' f; do if [[ -e "$f" ]]; then printf '%s\0' "$f"; fi; done \
        | tar -c --null -T - -f - | tar -x -C "$scratch/tree" -f -
    rm -f "$scratch/tree/uv.lock"
    if [[ -f "$scratch/uv.lock" ]]; then cp "$scratch/uv.lock" "$scratch/tree/uv.lock"; fi
)
lock_lowest() (  # lock_lowest SCRATCH
    cd "$1/tree"
    env -u VIRTUAL_ENV uv lock --quiet --resolution lowest-direct \
        --exclude-newer "$LOWEST_EXCLUDE_NEWER"
    cp uv.lock "$1/uv.lock"
)
sync_lowest() (  # sync_lowest SCRATCH X.Y
    cd "$1/tree"
    env -u VIRTUAL_ENV UV_PROJECT_ENVIRONMENT="$1/py$2" \
        uv sync --frozen --all-packages --no-group peers --quiet --python "${PYTHON_AT[$2]}"
    "$1/py$2/bin/python" -c '
from importlib.metadata import PackageNotFoundError, version
def at(name):
    try:
        return f"{name} {version(name)}"
    except PackageNotFoundError:
        return f"{name} (not installed)"
names = "jax jaxlib numpy typing_extensions pluggy hypothesis orbax-checkpoint optree jaxtyping beartype pytest"
print("   at", ", ".join(at(n) for n in names.split()))'
)
pytest_lowest() (  # pytest_lowest SCRATCH X.Y [pytest arguments]
    cd "$1/tree"
    venv="$1/py$2"
    local only_orbax=""
    if [[ -z "${JAXSTRUCT_TEST_WITHOUT_ORBAX:-}" && " $LOWEST_ONLY_ORBAX_PYTHONS " == *" $2 "* ]]; then
        only_orbax=1
    fi
    shift 2
    in_venv "$venv" env JAXSTRUCT_TEST_ONLY_ORBAX="$only_orbax" \
        HYPOTHESIS_PROFILE="$REPEAT_PROFILE" \
        python -m pytest -n 2 -q "${TOOLING[@]}" "${FIRST_ONLY[@]}" "${ONCE[@]}" "$@"
)
lowest_run() {  # lowest_run SCRATCH LABEL X.Y... : copy, lock, then sync and pytest on each
    local scratch=$1 label=$2 version todo=()
    shift 2
    for version in "$@"; do
        if [[ -n "${PYTHON_AT[$version]}" ]]; then todo+=("$version"); fi
    done
    ((${#todo[@]})) || return 0
    step "copy the tree to ${scratch#"$ROOT/"}" copy_tree "$scratch"
    if [[ -n "${JAXSTRUCT_TEST_WITHOUT_ORBAX:-}" ]]; then
        step "take jaxstruct-orbax out of the copy" \
            python scripts/without_orbax.py "$scratch/tree/pyproject.toml"
    fi
    step "lock $label" lock_lowest "$scratch"
    for version in "${todo[@]}"; do
        step "sync ${scratch#"$ROOT/"}/py$version" sync_lowest "$scratch" "$version"
    done
    # The tests read the real pyproject.toml (tests/test_packaging.py).
    cp "$ROOT/pyproject.toml" "$scratch/tree/pyproject.toml"
    for version in "${todo[@]}"; do
        local what=$label
        if [[ -z "${JAXSTRUCT_TEST_WITHOUT_ORBAX:-}" && " $LOWEST_ONLY_ORBAX_PYTHONS " == *" $version "* ]]; then
            what="$label, orbax tests"
        fi
        step "pytest, Python $version ($what)" pytest_lowest "$scratch" "$version" "${PYTEST_ARGS[@]}"
    done
}

PYTEST_ARGS=("$@")
unset JAXSTRUCT_TEST_PEERS
lowest_run "$ROOT/.venvs/lowest" "lowest-direct" $LOWEST_PYTHONS
# Without jaxstruct-orbax installed, tests/conftest.py skips the orbax tests (by
# name) only when JAXSTRUCT_TEST_WITHOUT_ORBAX=1, and fails if it is installed.
export JAXSTRUCT_TEST_WITHOUT_ORBAX=1
lowest_run "$ROOT/.venvs/lowest-core" "lowest-direct, without orbax" $LOWEST_CORE_PYTHONS
