"""What a restore target vouches for: its classes at their places, unstored fields, code.

The checkpoints here are written by another process (as a training job's are),
from a module of the user's; this process imports that module, so it has the
classes, but jaxstruct has never seen the namedtuples, enums and other
libraries' nodes in it. A target holding them vouches for them, at the same
place only (issue 20, items 2, 3 and 5).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.registry import SerializationError

# Other libraries' pytrees: the peers group, absent only in the lowest-versions runs
# (where conftest allows the skip; everywhere else a missing peer fails the run).
for _peer in ("optax", "equinox", "flax"):
    pytest.importorskip(_peer)

TIMEOUT = 120
MODULE = "vouch_usermod"
FORMATS = ("directory", "zip", "orbax")
SUFFIX = {"directory": "", "zip": ".zip", "orbax": ""}

USER_MODULE = textwrap.dedent(
    '''
    """A user's training code: an optimizer state of namedtuples, an enum, a model."""
    import enum
    from typing import Any, NamedTuple

    import equinox as eqx
    import flax.struct
    import jax
    import jax.numpy as jnp
    import jaxstruct.core as js


    class Moments(NamedTuple):
        count: Any
        mu: Any


    class Other(NamedTuple):
        count: Any
        mu: Any


    class Mode(enum.Enum):
        TRAIN = "train"
        EVAL = "eval"


    @flax.struct.dataclass
    class FlaxState:
        step: jax.Array
        scale: float = flax.struct.field(pytree_node=False, default=2.0)
        apply_fn: Any = flax.struct.field(pytree_node=False, default=None)


    def forward(x):
        return x * 2


    class State(js.Struct):
        params: dict
        opt: Any
        mode: Mode = js.field(static=True, default=Mode.TRAIN)
        tx: Any = js.field(static=True, default=None, serialize=False)
        note: str = js.field(pytree=False, default="default note")


    def make(seed=0):
        w = jnp.arange(6.0).reshape(2, 3) + seed
        return State(
            params={"w": w},
            opt=(Moments(jnp.array(seed, jnp.int32), {"w": w * 0.5}), Other(1, 2)),
            mode=Mode.EVAL,
            tx=forward,
            note="from the target",
        )


    def make_foreign(seed=0):
        mlp = eqx.nn.MLP(3, 2, 4, 1, key=jax.random.key(seed))
        return {"mlp": mlp, "flax": FlaxState(jnp.array(seed), apply_fn=forward)}
    '''
)


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The user's module, and checkpoints of it written by another process."""
    root = tmp_path_factory.mktemp("vouch")
    (root / f"{MODULE}.py").write_text(USER_MODULE)
    script = textwrap.dedent(
        f"""
        import sys
        import jaxstruct.io as jio
        import {MODULE} as m
        for fmt, suffix in {list(SUFFIX.items())!r}:
            jio.export(m.make(5), sys.argv[1] + "/state_" + fmt + suffix, format=fmt)
            jio.export(m.make_foreign(5), sys.argv[1] + "/foreign_" + fmt + suffix, format=fmt)
        """
    )
    env_path = f"{root}"
    subprocess.run(
        [sys.executable, "-c", script, str(root)],
        check=True,
        timeout=TIMEOUT,
        cwd=root,
        env={**_env(), "PYTHONPATH": env_path},
    )
    sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(root))
    module.root = root  # type: ignore[attr-defined]
    return module


def _forget(user: Any) -> None:
    """Make this process forget the user's classes again, as a fresh process would."""
    from jaxstruct.registry import _refs

    for name in ("Moments", "Other", "Mode"):
        _refs._cache.pop(f"{MODULE}:{name}", None)


@pytest.fixture(autouse=True)
def _fresh_registry(user: Any) -> Any:
    _forget(user)
    yield
    _forget(user)


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _path(user: Any, kind: str, fmt: str) -> Path:
    return user.root / f"{kind}_{fmt}{SUFFIX[fmt]}"


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


@pytest.mark.parametrize("fmt", FORMATS)
def test_without_a_target_unknown_classes_are_refused(user: Any, fmt: str) -> None:
    """A namedtuple jaxstruct never saw in this process is refused without a target."""
    with pytest.raises(SerializationError, match=r"vouch_usermod:Moments.*target="):
        jio.load(_path(user, "state", fmt))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["concrete", "abstract"])
def test_the_target_vouches_for_its_classes(user: Any, fmt: str, kind: str) -> None:
    """Namedtuples and enums held by the target are accepted at their places, no allow_imports."""
    model = user.make(0)
    target = model if kind == "concrete" else jax.eval_shape(lambda: user.make(0))
    back = jio.load(_path(user, "state", fmt), target=target)
    assert type(back) is user.State
    assert type(back.opt[0]) is user.Moments and type(back.opt[1]) is user.Other
    assert back.mode is user.Mode.EVAL
    assert int(back.opt[0].count) == 5
    np.testing.assert_array_equal(back.params["w"], np.arange(6.0).reshape(2, 3) + 5)


@pytest.mark.parametrize("fmt", FORMATS)
def test_unstored_fields_come_from_the_target(user: Any, fmt: str) -> None:
    """serialize=False and opaque fields take the target's values, not their defaults."""
    back = jio.load(_path(user, "state", fmt), target=jax.eval_shape(lambda: user.make(0)))
    assert back.tx is user.forward
    assert back.note == "from the target"
    without = jio.load(_path(user, "state", fmt), allow_imports=[MODULE])
    assert without.tx is None and without.note == "default note"


def test_a_class_at_another_place_is_still_refused(user: Any) -> None:
    """The target's Moments at opt[0] does not vouch for Moments named at opt[1]."""
    path = user.root / "hostile"
    value = user.make(1)
    value = value.replace(opt=(value.opt[0], user.Moments(1, 2)))
    jio.export(value, path)
    _forget(user)
    target = jax.eval_shape(lambda: user.make(0))  # opt[1] is an Other there
    with pytest.raises(SerializationError, match=r"root\.opt\[1\].*vouch_usermod:Moments"):
        jio.load(path, target=target)


def test_a_target_class_the_file_does_not_name_is_not_used(user: Any, tmp_path: Path) -> None:
    """Where the file stores a plain tuple, the target's namedtuple changes nothing."""
    path = jio.export({"opt": (1, 2)}, tmp_path / "plain")
    back = jio.load(path, target={"opt": user.Other(None, None)})
    assert type(back["opt"]) is tuple and back["opt"] == (1, 2)


def test_a_target_class_of_another_name_vouches_for_nothing(user: Any, tmp_path: Path) -> None:
    """A target holding Other where the file names Moments does not let Moments in."""
    path = jio.export({"opt": user.Moments(1, 2)}, tmp_path / "ck")
    _forget(user)
    with pytest.raises(SerializationError, match="vouch_usermod:Moments"):
        jio.load(path, target={"opt": user.Other(None, None)})


@pytest.mark.parametrize("fmt", FORMATS)
def test_other_libraries_pytrees_round_trip(user: Any, fmt: str) -> None:
    """An equinox MLP and a flax.struct dataclass are rebuilt by their own unflatten."""
    path = _path(user, "foreign", fmt)
    expected = user.make_foreign(5)
    import equinox as eqx

    # equinox's own eval_shape: it keeps the functions an MLP holds.
    back = jio.load(path, target=eqx.filter_eval_shape(user.make_foreign, 0))
    assert type(back["mlp"]) is type(expected["mlp"])
    assert type(back["flax"]) is user.FlaxState
    assert back["flax"].scale == 2.0 and back["flax"].apply_fn is user.forward
    x = jnp.ones(3)
    np.testing.assert_array_equal(back["mlp"](x), expected["mlp"](x))
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fmt", FORMATS)
def test_functions_inside_other_pytrees_need_the_target(user: Any, fmt: str) -> None:
    """Without a target, the stored function names are refused, never resolved."""
    with pytest.raises(SerializationError, match=r"function .*never store code.*target="):
        jio.load(_path(user, "foreign", fmt))


def test_registered_classes_of_imported_modules_load_without_a_target(tmp_path: Path) -> None:
    """A flax.struct dataclass of data only loads with its module imported, no target."""
    import flax.struct

    path = jio.export({"s": _Scaled(jnp.arange(3.0))}, tmp_path / "ck")
    back = jio.load(path)
    assert type(back["s"]) is _Scaled and back["s"].scale == 3
    np.testing.assert_array_equal(back["s"].x, np.arange(3.0))
    assert flax.struct.dataclass  # the decorator the class was made with


def test_a_hostile_class_reference_in_a_foreign_node_is_refused(tmp_path: Path) -> None:
    """A file naming an unregistered class as a pytree node is refused, and nothing runs."""
    import json

    path = jio.export({"s": _Scaled(jnp.arange(3.0))}, tmp_path / "ck")
    manifest = path / "manifest.json"
    text = manifest.read_text().replace(f"{__name__}:_Scaled", "subprocess:Popen")
    manifest.write_bytes(jio.seal_manifest(json.loads(text)))  # edited on purpose
    nodes = json.loads(text)["manifest"]["nodes"]
    assert any(node[:2] == ["pytree", "subprocess:Popen"] for node in nodes)
    with pytest.raises(SerializationError, match="subprocess:Popen"):
        jio.load(path)


def _scaled_cls() -> Any:
    import flax.struct

    @flax.struct.dataclass
    class _Scaled:
        x: jax.Array
        scale: int = flax.struct.field(pytree_node=False, default=3)

    _Scaled.__qualname__ = "_Scaled"
    return _Scaled


_Scaled = _scaled_cls()


def test_a_function_in_a_static_field_names_serialize_false(tmp_path: Path) -> None:
    """Exporting code in an ordinary static field says serialize=False first (item 4)."""

    class TrainState(js.Struct):
        step: Any
        tx: Any = js.field(static=True, default=None)

    state = TrainState(step=jnp.array(0), tx=_optimizer())
    with pytest.raises(SerializationError, match=r"root\.tx.*serialize=False") as err:
        jio.export(state, tmp_path / "ck")
    assert str(err.value).index("serialize=False") < 400
    assert not (tmp_path / "ck").exists()


def _optimizer() -> Any:
    import optax

    return optax.adamw(1e-3)


def test_a_struct_disguised_as_a_jax_node_is_refused(tmp_path: Path) -> None:
    """A file may not rebuild a struct through raw unflatten, skipping its validators."""
    path = jio.export({"s": _Scaled(jnp.arange(3.0))}, tmp_path / "ck")
    manifest = path / "manifest.json"
    ref = js.class_ref(_Checked)
    text = manifest.read_text().replace(f"{__name__}:_Scaled", ref)
    manifest.write_bytes(jio.seal_manifest(json.loads(text)))  # edited on purpose
    with pytest.raises(SerializationError, match=r"is a Struct now.*another library's pytree"):
        jio.load(path)
    # Vouched for, it is built by the struct's own construction: the validator refuses it.
    with pytest.raises(SerializationError, match="building _Checked"):
        jio.load(path, load_cls={ref: _Checked})


class _Checked(js.Struct):
    x: Any = js.field(validator=lambda x: x.shape == (99,))
    scale: int = js.field(static=True, default=3)
