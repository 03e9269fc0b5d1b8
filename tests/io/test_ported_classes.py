"""Checkpoints saved while a class was another library's pytree node (flax.struct, equinox,
chex) load into the Struct that class became, when the user vouches for it (issue 39, item 1)."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.registry import SerializationError

# The peers group: absent only in the lowest-versions runs (conftest allows the skip there).
pytest.importorskip("flax")
pytest.importorskip("equinox")

BEFORE = {
    "flax": """
        import flax.struct
        from typing import Any

        def forward(x):
            return x

        @flax.struct.dataclass
        class State:
            mean: Any
            count: Any
            apply_fn: Any = flax.struct.field(pytree_node=False, default=None)
            scale: float = flax.struct.field(pytree_node=False, default=2.0)
    """,
    "equinox": """
        import equinox as eqx
        from typing import Any

        def forward(x):
            return x

        class State(eqx.Module):
            mean: Any
            count: Any
            apply_fn: Any = eqx.field(static=True, default=None)
            scale: float = eqx.field(static=True, default=2.0)
    """,
    # chex has no static fields: every field is a leaf, and a function cannot be one.
    "chex": """
        import chex
        from typing import Any

        def forward(x):
            return x

        @chex.dataclass(frozen=True)
        class State:
            mean: Any
            count: Any
            apply_fn: Any = None
            scale: float = 2.0
    """,
}

AFTER = """
    import jax.numpy as jnp
    import jaxstruct.core as js
    from typing import Any

    def forward(x):
        return x

    def _check(mean):
        if mean.shape != (3,):
            raise ValueError("mean must have 3 entries")

    class State(js.Struct):
        mean: Any = js.field(converter=jnp.asarray, validator=_check)
        count: Any
        apply_fn: Any = js.field(static=True, default=None, serialize=False)
        scale: float = js.field(static=True, default=2.0)

        def __post_init__(self):
            if self.scale <= 0:
                raise ValueError("scale must be positive")
"""


@pytest.fixture(params=sorted(BEFORE))
def ported(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    """A checkpoint written while ``State`` was a flax.struct dataclass (or an equinox
    Module), and the module reloaded with ``State`` a Struct."""
    pytest.importorskip(request.param)
    name = f"ported_{request.param}"
    module_file = tmp_path / f"{name}.py"
    module_file.write_text(textwrap.dedent(BEFORE[request.param]))
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module(name)
        apply_fn = None if request.param == "chex" else module.forward
        old = module.State(mean=jnp.arange(3.0), count=jnp.int32(4), apply_fn=apply_fn)
        path = jio.export({"state": old}, tmp_path / "ck")
        jio.export(old, tmp_path / "root")
        # Sound for the old class, refused by the struct's validator.
        jio.export({"state": module.State(mean=jnp.zeros(4), count=jnp.int32(0))}, tmp_path / "bad")
        module_file.write_text(textwrap.dedent(AFTER))
        importlib.invalidate_caches()
        module = importlib.reload(module)
        yield module, path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_without_vouching_the_error_says_what_happened_and_how_to_load(
    ported: tuple[Any, Path],
) -> None:
    """Loading without target= or load_cls= names the old kind of node and both ways out."""
    _module, path = ported
    with pytest.raises(SerializationError) as info:
        jio.load(path)
    text = str(info.value)
    assert "is a Struct now" in text and "flax.struct" in text and "equinox" in text
    assert "target=" in text and "load_cls=" in text
    assert "never does that" not in text


def test_a_target_holding_the_struct_loads_it_by_field_names(ported: tuple[Any, Path]) -> None:
    """target= holding the struct vouches for it: the fields are matched by name, the
    struct's own construction runs, and fields the file keeps as static data (here a
    function) come from the target."""
    module, path = ported
    target = {"state": jax.eval_shape(lambda: module.State(jnp.zeros(3), jnp.int32(0)))}
    target["state"] = target["state"].replace(apply_fn=module.forward)
    back = jio.load(path, target=target)["state"]
    assert type(back) is module.State
    np.testing.assert_array_equal(back.mean, np.arange(3.0))
    # chex stored apply_fn as a field (None): the file's value, not the target's.
    stored_fn = None if module.__name__ == "ported_chex" else module.forward
    assert int(back.count) == 4 and back.apply_fn is stored_fn and back.scale == 2.0


def test_load_cls_vouches_for_the_struct(ported: tuple[Any, Path]) -> None:
    """load_cls={ref: Struct} loads it too; a field the file keeps only in the old class's
    static data (the function) takes its default, and nothing stored there is run."""
    module, path = ported
    ref = f"{module.__name__}:State"
    back = jio.load(path, load_cls={ref: module.State})["state"]
    assert type(back) is module.State and back.apply_fn is None and back.scale == 2.0
    np.testing.assert_array_equal(back.mean, np.arange(3.0))
    assert int(back.count) == 4


def test_the_struct_checks_run_on_a_ported_value(ported: tuple[Any, Path]) -> None:
    """The struct is built by its own constructor: a file cannot skip its validators (a
    stored mean of the wrong shape is refused)."""
    module, path = ported
    with pytest.raises(SerializationError, match="mean must have 3 entries"):
        jio.load(path.parent / "bad", load_cls={f"{module.__name__}:State": module.State})


def test_load_cls_as_a_class_vouches_for_the_root(ported: tuple[Any, Path]) -> None:
    """load_cls=State (the class itself) loads a root stored by the old class."""
    module, path = ported
    back = jio.load(path.parent / "root", load_cls=module.State)
    assert type(back) is module.State and int(back.count) == 4
