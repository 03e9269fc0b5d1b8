"""The ``jaxstruct`` command line: ``jaxstruct inspect PATH``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jaxstruct.registry import StructError

from ._inspect import inspect

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jaxstruct`` command; return the exit status.

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
    show.add_argument(
        "--max-manifest-bytes", type=int, default=None, help="raise the manifest size limit"
    )
    args = parser.parse_args(argv)
    limits = (
        {} if args.max_manifest_bytes is None else {"max_manifest_bytes": args.max_manifest_bytes}
    )
    try:
        info = inspect(args.path, **limits)
    except (StructError, OSError) as err:
        print(f"jaxstruct inspect: error: {err}", file=sys.stderr)
        return 2
    print(info)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
