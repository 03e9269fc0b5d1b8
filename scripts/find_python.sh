#!/usr/bin/env bash
# Print the path of a CPython X.Y installed on this machine; never download one.
#     bash scripts/find_python.sh 3.12
# Looks for pythonX.Y on PATH, in pyenv's versions, then among the interpreters
# uv knows. Exit status: 0 found; 2 missing (a warning, outside CI); 1 missing
# with CI=true (an error: CI must test every supported Python) or bad usage.
set -euo pipefail

if [[ $# -ne 1 || ! "$1" =~ ^3\.[0-9]+$ ]]; then
    echo "usage: $0 X.Y (a Python version such as 3.12)" >&2
    exit 1
fi
want=$1

identify() {  # "3.12 /path/to/python3.12" for a working CPython at $1, nothing otherwise
    "$1" -c 'import sys
if sys.implementation.name == "cpython":
    print("%d.%d" % sys.version_info[:2], sys.executable)' 2>/dev/null || true
}

candidates=("$(command -v "python$want" || true)")
# pyenv's shims only run the selected version, so look at its installs directly.
for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$want".*/bin/"python$want"; do
    candidates+=("$candidate")
done
if command -v uv >/dev/null 2>&1; then
    candidates+=("$(UV_PYTHON_DOWNLOADS=never uv python find --no-project "$want" 2>/dev/null || true)")
fi
for candidate in "${candidates[@]}"; do
    [[ -n "$candidate" && -x "$candidate" ]] || continue
    found=$(identify "$candidate")
    if [[ "${found%% *}" == "$want" ]]; then
        echo "${found#* }"  # the interpreter itself, not a shim or wrapper
        exit 0
    fi
done

where="looked for python$want on PATH, in ${PYENV_ROOT:-$HOME/.pyenv}/versions and among uv's interpreters"
if [[ "${CI:-}" == "true" ]]; then
    echo "error: CPython $want not found ($where); CI (CI=true) must test every supported Python: install CPython $want." >&2
    exit 1
fi
echo "warning: CPython $want not found ($where); skipping it. Install CPython $want to test on it." >&2
exit 2
