"""Partial restore (``load(select=...)``) and codec values.

The skeleton a selection runs on holds abstract arrays; a codec must never see
them. There, every codec value stays undecoded as a :class:`CodecStandIn`, a
pytree node whose leaves are the abstract arrays inside it, so a selection that
reaches into a codec value reads that value's arrays and one that does not
reads none of them. In the final decode, a codec value holding an array that
was not read stays undecoded the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ._codecs import Codec
from ._plugins import current_registry

__all__ = ["CodecStandIn", "outside_selection", "undecoded_codec"]


def undecoded_codec(name: str) -> Codec | None:
    """For a partial restore's skeleton: a codec keeping the stored value, undecoded.

    Its arrays stay visible as leaves of the stand-in (a pytree node), so only
    a selection that reaches into a codec value reads that value's arrays,
    and no codec sees abstract arrays.
    """
    if current_registry().codec_named(name) is None:
        return None
    _register_stand_in()
    return Codec(name, (CodecStandIn,), encode=lambda v: v, decode=CodecStandIn)


def outside_selection(abstract: list[Any]) -> Callable[[str], Codec | None]:
    """Codecs for the final decode of a partial restore: a codec value holding an array
    that was not read (outside the selection) stays undecoded."""
    import jax

    ids = {id(v) for v in abstract}

    def lookup(name: str) -> Codec | None:
        codec = current_registry().codec_named(name)
        if codec is None:
            return None
        _register_stand_in()

        def decode(stored: Any) -> Any:
            leaves = jax.tree_util.tree_leaves(stored)
            if any(id(leaf) in ids for leaf in leaves):
                return CodecStandIn(stored)
            return codec.decode(stored)

        return Codec(name, (*codec.types, CodecStandIn), codec.encode, decode)

    return lookup


class CodecStandIn:
    """A codec value in a partial restore's skeleton: the value as stored, not yet decoded."""

    def __init__(self, stored: Any) -> None:
        self.stored = stored


@functools.cache
def _register_stand_in() -> None:
    import jax

    jax.tree_util.register_pytree_node(
        CodecStandIn, lambda s: ((s.stored,), None), lambda _, kids: CodecStandIn(kids[0])
    )
