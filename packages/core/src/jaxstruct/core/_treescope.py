"""treescope rendering of structs: one foldable line per field, kinds marked.

Only called from ``Struct.__treescope_repr__``, that is when treescope is
already rendering, so importing treescope here costs nothing extra and
``import jaxstruct.core`` never imports it.

Node fields render plainly (treescope shows arrays with its own summaries),
static fields carry a ``# static`` comment and opaque fields ``# opaque``;
fields declared with ``repr=False`` appear only in treescope's round-trip mode.
"""

from __future__ import annotations

from typing import Any

from ._fields import FieldKind

__all__ = ["render_struct"]

_MARKS = {FieldKind.STATIC: "  # static", FieldKind.OPAQUE: "  # opaque"}


def render_struct(obj: Any, path: str | None, subtree_renderer: Any) -> Any:
    """Build the treescope rendering of struct ``obj`` (see ``__treescope_repr__``)."""
    from treescope import rendering_parts as rp

    cls = type(obj)
    fields = cls.__struct_layout__.fields
    children = []
    for i, spec in enumerate(fields):
        name = spec.name
        child_path = None if path is None else f"{path}.{name}"
        if i < len(fields) - 1:
            comma = rp.siblings(",", rp.fold_condition(collapsed=rp.text(" ")))
        else:
            comma = rp.fold_condition(expanded=rp.text(","))
        mark = _MARKS.get(spec.kind)
        parts = [
            rp.siblings_with_annotations(
                f"{name}=", subtree_renderer(getattr(obj, name), path=child_path)
            ),
            comma,
        ]
        if mark is not None:
            parts.append(rp.fold_condition(expanded=rp.comment_color(rp.text(mark))))
        line = rp.build_full_line_with_annotations(*parts)
        if not spec.repr:
            line = rp.roundtrip_condition(roundtrip=line)
        children.append(line)
    # Outside round-trip mode the name is wrapped in <...>: the listed fields
    # are attributes, not always the constructor's arguments (init=False, derived).
    prefix = rp.siblings(
        rp.roundtrip_condition(roundtrip=rp.text("<")),
        rp.maybe_qualified_type_name(cls),
        "(",
    )
    suffix = rp.siblings(")", rp.roundtrip_condition(roundtrip=rp.text(">")))
    return rp.build_foldable_tree_node_from_children(
        prefix=prefix, children=children, suffix=suffix, path=path
    )
