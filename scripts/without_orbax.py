"""Take jaxstruct-orbax out of a scratch copy of the workspace (scripts/test.sh's core floors).

    python scripts/without_orbax.py COPY/pyproject.toml

jaxstruct-orbax needs a newer JAX than the other layers (its floor is above
theirs), so a lowest-direct resolution that includes it never reaches the other
layers' JAX floor. This edits the root pyproject.toml of a copy of the tree (never
the repository's own): the umbrella no longer depends on jaxstruct-orbax, the
workspace excludes packages/orbax, and the peers group (never installed at the
floors, but resolved all the same) is emptied. The copy is locked and synced so; the tests then
run with the original pyproject.toml put back. Each edit must match exactly once,
so a changed pyproject.toml fails here with the text it looked for.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

EDITS = [
    # (what it does, pattern, replacement)
    (
        "drop the umbrella's jaxstruct-orbax requirement",
        r'\n    "jaxstruct-orbax[=<>!~][^"]*",',
        "",
    ),
    (
        "drop the jaxstruct-orbax workspace source",
        r"\njaxstruct-orbax = \{ workspace = true \}",
        "",
    ),
    (
        "exclude packages/orbax from the workspace",
        r"(\[tool\.uv\.workspace\]\n(?:#[^\n]*\n)*members = \[[^\]]*\])",
        r'\1\nexclude = ["packages/orbax"]',
    ),
    # The peers (optax, flax, equinox) are never installed at the floors, but a
    # lowest resolution still resolves them: flax's orbax-checkpoint would lift JAX
    # from 0.4.36 to 0.6.0 here. The group stays, empty, for `--no-group peers`.
    ("empty the peers dependency group", r"\npeers = \[[^\]]*\]", "\npeers = []"),
]


def main(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    for what, pattern, replacement in EDITS:
        text, count = re.subn(pattern, replacement, text)
        if count != 1:
            sys.exit(f"{path}: cannot {what}: {pattern!r} matched {count} times, not once")
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
