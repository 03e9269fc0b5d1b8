"""The ``jaxstruct`` command line: ``jaxstruct inspect PATH [--json] [--verify]``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from jaxstruct.registry import StructError

from ._inspect import inspect, verify

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jaxstruct`` command; return the exit status.

    ``0``: done (and with ``--verify``, every member is sound); ``1``:
    ``--verify`` found bad members (each is named on stderr); ``2``: the
    checkpoint could not be read.

    Example:
        >>> main(["inspect", "/nonexistent/checkpoint"])
        2
    """
    parser = argparse.ArgumentParser(prog="jaxstruct", description="jaxstruct checkpoint tools")
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser(
        "inspect", help="print a checkpoint's manifest as a tree, without loading arrays"
    )
    show.add_argument("path", help="checkpoint directory or .zip archive")
    show.add_argument("--json", action="store_true", help="print the report as JSON")
    show.add_argument(
        "--verify",
        action="store_true",
        help="also read every array member and check sizes, CRCs, dtypes and shapes",
    )
    show.add_argument(
        "--max-manifest-bytes", type=int, default=None, help="raise the manifest size limit"
    )
    show.add_argument("--max-nodes", type=int, default=None, help="raise the node count limit")
    args = parser.parse_args(argv)
    limits = {
        name: value
        for name, value in (
            ("max_manifest_bytes", args.max_manifest_bytes),
            ("max_nodes", args.max_nodes),
        )
        if value is not None
    }
    try:
        info = inspect(args.path, **limits)
        problems = verify(args.path, **limits) if args.verify else None
    except (StructError, OSError) as err:
        print(f"jaxstruct inspect: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        report = info.to_json()
        if problems is not None:
            report["verify"] = {"ok": not problems, "problems": problems}
        print(json.dumps(report, indent=1))
    else:
        print(info)
        if problems is not None and not problems:
            print("verify: every member is sound")
    for problem in problems or ():
        print(f"jaxstruct inspect: bad member: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
