"""The ``jaxstruct`` command line: ``inspect`` a checkpoint, list the ``plugins``."""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence

from jaxstruct.registry import StructError

from ._inspect import inspect, verify_report
from ._plugins import PluginWarning, current_registry


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jaxstruct`` command; return the exit status.

    ``jaxstruct inspect``: ``0``: done (and with ``--verify``, every member is
    sound, checked against its checksums); ``1``: ``--verify`` found bad members
    (each is named on stderr); ``2``: the checkpoint could not be read; ``3``:
    ``--verify`` read every array but could check nothing (the checkpoint carries
    no checksums: another tool wrote it, or jaxstruct before checksums).
    ``jaxstruct plugins``: ``0``: every
    installed plugin is loaded or disabled on purpose; ``1``: a plugin failed, or
    clashes with another (each is listed with why). Output cut short by its
    reader (``| head``) ends the command quietly.

    Example:
        >>> main(["inspect", "/nonexistent/checkpoint"])
        2
    """
    parser = argparse.ArgumentParser(prog="jaxstruct", description="jaxstruct checkpoint tools")
    commands = parser.add_subparsers(dest="command", required=True)
    show = commands.add_parser(
        "inspect", help="print a checkpoint's manifest as a tree, without loading arrays"
    )
    show.add_argument(
        "path",
        help="checkpoint directory or file (.zip, or a plugin format's such as .safetensors), "
        "including one another tool wrote",
    )
    show.add_argument("--json", action="store_true", help="print the report as JSON")
    show.add_argument(
        "--verify",
        action="store_true",
        help="also read every array member and check sizes, checksums, dtypes and shapes",
    )
    show.add_argument(
        "--max-manifest-bytes", type=int, default=None, help="raise the manifest size limit"
    )
    show.add_argument("--max-nodes", type=int, default=None, help="raise the node count limit")
    listing = commands.add_parser(
        "plugins",
        help="list every jaxstruct.io plugin, its distribution and version, what it registers "
        "and its state (loaded, failed and why, disabled); exit status 1 when a plugin failed "
        "or clashes with another",
    )
    listing.add_argument("--json", action="store_true", help="print the list as JSON")
    args = parser.parse_args(argv)
    try:
        status = _plugins(as_json=args.json) if args.command == "plugins" else _inspect(args)
        sys.stdout.flush()  # a reader gone away shows here, not at interpreter exit
    except BrokenPipeError:
        # The reader went away (``| head``): stop writing, without a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0
    return status


def _plugins(*, as_json: bool) -> int:
    with warnings.catch_warnings():
        # Each failed plugin is listed with its reason below; no warning on top.
        warnings.simplefilter("ignore", PluginWarning)
        infos = current_registry().plugins()
    if as_json:
        print(json.dumps([info.to_json() for info in infos], indent=1))
    else:
        print("\n".join(str(info) for info in infos))
    broken = [info for info in infos if info.state == "failed" or info.problems]
    if broken:
        names = ", ".join(f"{info.name!r} ({info.distribution})" for info in broken)
        print(f"jaxstruct plugins: not every plugin works: {names}", file=sys.stderr)
        return 1
    return 0


def _inspect(args: argparse.Namespace) -> int:
    limits = {n: v for n, v in vars(args).items() if n.startswith("max_") and v is not None}
    try:
        info = inspect(args.path, **limits)
        problems, checksummed = verify_report(args.path, **limits) if args.verify else (None, False)
    except (StructError, OSError) as err:
        print(f"jaxstruct inspect: error: {err}", file=sys.stderr)
        return 2
    if args.json:
        report = info.to_json()
        if problems is not None:
            report["verify"] = {"ok": not problems, "problems": problems, "checksums": checksummed}
        print(json.dumps(report, indent=1))
    else:
        print(info)
        if problems is not None and not problems:
            print(
                "verify: every member is sound"
                if checksummed
                else "verify: every array read; no checksums were checked (checksums: "
                f"{info.checksums}), so a changed byte would go unnoticed"
            )
    for problem in problems or ():
        print(f"jaxstruct inspect: bad member: {problem}", file=sys.stderr)
    if problems:
        return 1
    return 3 if problems is not None and not checksummed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
