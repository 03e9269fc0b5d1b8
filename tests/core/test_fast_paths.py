"""Structural guards for the hot paths (speed itself is measured in benchmarks/)."""

from __future__ import annotations

import operator
import sys

import jax
import jax.numpy as jnp
import jaxstruct.core as js
import pytest


class _Point(js.Struct):
    x: object
    y: object
    tag: str = js.field(static=True, default="p")


def test_no_getattr_fallback_on_struct_classes() -> None:
    """No struct class defines __getattr__: on CPython 3.11 it slows every attribute read."""
    assert all("__getattr__" not in klass.__dict__ for klass in _Point.__mro__)


def test_flatten_is_a_c_level_attrgetter() -> None:
    """JAX flattens a struct through operator.attrgetter, without calling Python code."""
    assert isinstance(js.resolve_pytree_spec(_Point).flatten, operator.attrgetter)


def test_flattened_form_is_current_after_construction_replace_and_unflatten() -> None:
    """The stored (children, aux) pair matches the fields after every way of making an instance."""
    p = _Point(x=jnp.ones(2), y=1.0)
    q = p.replace(tag="q")
    r = jax.tree_util.tree_map(lambda a: a * 2, q)
    for obj in (p, q, r):
        leaves = jax.tree_util.tree_leaves(obj)
        assert len(leaves) == 2 and leaves[1] == obj.y
        assert jax.tree_util.tree_structure(obj) == jax.tree_util.tree_structure(
            _Point(x=obj.x, y=obj.y, tag=obj.tag)
        )


def test_post_init_assignment_after_flatten_is_not_stale() -> None:
    """A field changed in __post_init__ after the instance was flattened is seen by JAX."""

    class Late(js.Struct):
        x: object

        def __post_init__(self) -> None:
            jax.tree_util.tree_leaves(self)  # flattens the half-built instance
            self.x = 5

    assert jax.tree_util.tree_leaves(Late(x=1)) == [5]


def test_flatten_with_keys_is_a_c_level_attrgetter() -> None:
    """Paths come from a cached keyed form read by operator.attrgetter too."""
    assert isinstance(js.resolve_pytree_spec(_Point).flatten_with_keys, operator.attrgetter)


def test_flattened_form_is_built_on_first_flatten_not_by_construction() -> None:
    """Construction leaves the flattened form to the first flatten, which keeps it."""
    p = _Point(x=jnp.ones(2), y=1.0)
    assert "_jaxstruct_flat" not in vars(p)
    leaves, treedef = jax.tree_util.tree_flatten(p)
    assert vars(p)["_jaxstruct_flat"] == ((p.x, 1.0), ("p",))
    # Unflatten stores the form it was given right away.
    assert "_jaxstruct_flat" in vars(jax.tree_util.tree_unflatten(treedef, leaves))


def test_paths_are_current_after_construction_replace_and_unflatten() -> None:
    """tree_flatten_with_path names every node field, however the instance was made."""
    p = _Point(x=jnp.ones(2), y=1.0)
    for obj in (p, p.replace(y=2.0), jax.tree_util.tree_map(lambda a: a, p)):
        for _ in range(2):  # the second call reads the cached keyed form
            pairs = jax.tree_util.tree_flatten_with_path(obj)[0]
            assert [jax.tree_util.keystr(k) for k, _ in pairs] == [".x", ".y"]
            assert pairs[1][1] == obj.y


def test_post_init_flattens_see_every_assignment() -> None:
    """Flattening a half-built instance never caches: each flatten sees the latest fields."""
    seen: list[list[object]] = []

    class Steps(js.Struct):
        a: object
        b: object = 0

        def __post_init__(self) -> None:
            seen.append(jax.tree_util.tree_leaves(self))
            self.b = 2
            seen.append([v for _, v in jax.tree_util.tree_flatten_with_path(self)[0]])
            self.a = 3

    s = Steps(a=1)
    assert seen == [[1, 0], [1, 2]]
    assert jax.tree_util.tree_leaves(s) == [3, 2]
    assert [v for _, v in jax.tree_util.tree_flatten_with_path(s)[0]] == [3, 2]


def test_rederive_refreshes_paths_and_leaves() -> None:
    """After rederive() both flattened forms (plain and with paths) show the new values."""

    class Bag(js.Struct):
        items: list[int]
        size: int = js.field(static=True, init=False, derived=lambda self: len(self.items))

    bag = Bag(items=[1])
    fresh = Bag(items=[1, 7])
    assert jax.tree_util.tree_structure(bag) != jax.tree_util.tree_structure(fresh)
    jax.tree_util.tree_flatten_with_path(bag)  # caches the keyed form
    bag.items.append(7)
    bag.rederive()
    assert jax.tree_util.tree_structure(bag) == jax.tree_util.tree_structure(fresh)
    pairs, treedef = jax.tree_util.tree_flatten_with_path(bag)
    assert treedef == jax.tree_util.tree_structure(fresh)
    assert [v for _, v in pairs] == [1, 7]


class _Conv(js.Struct):
    x: object = js.field(converter=jnp.asarray)
    n: object = js.field(static=True, default=1)


def test_generated_replace_is_installed_and_keyword_only() -> None:
    """The first replace() compiles one with every field as an optional keyword."""
    import inspect

    p = _Conv(x=1.0)
    q = p.replace(n=2)
    method = type(p).__dict__["replace"]
    params = inspect.signature(method).parameters
    assert [n for n, v in params.items() if v.kind is v.KEYWORD_ONLY] == ["x", "n"]
    assert str(inspect.signature(method)) == "(self, /, *, x=<unchanged>, n=<unchanged>)"
    assert method.__doc__ and "Return a copy" in method.__doc__
    assert q.x is p.x and q.n == 2  # an unchanged field is not converted again
    r = q.replace(x=[1, 2])
    assert isinstance(r.x, jax.Array) and r.n == 2  # a changed field is
    assert p.replace() == p and p.replace() is not p


def test_generated_replace_errors_name_the_field() -> None:
    """Unknown names, positional arguments and bad static values get clear errors."""
    p = _Conv(x=1.0)
    p.replace()
    with pytest.raises(TypeError, match=r"unknown field 'y'.*fields are \['x', 'n'\]"):
        p.replace(y=1)
    with pytest.raises(TypeError):
        p.replace(2.0)  # type: ignore[misc]
    with pytest.raises(js.ValidationError, match=r"_Conv\.n must be hashable"):
        p.replace(n=[1])
    with pytest.raises(js.ValidationError, match="holds an array"):
        p.replace(n=jnp.ones(2))


def test_replace_on_subclasses_and_user_overrides() -> None:
    """A subclass gets its own replace; a user-defined replace is never overwritten."""

    class Base(js.Struct):
        x: int

    class Child(Base):
        y: int = 0

    class Custom(Base):
        def replace(self, **changes: object) -> Custom:
            changes.setdefault("x", 100)
            return super().replace(**changes)

    assert Base(x=1).replace(x=2) == Base(x=2)
    c = Child(x=1, y=5).replace(x=3)
    assert type(c) is Child and (c.x, c.y) == (3, 5)
    assert "replace" in Child.__dict__
    d = Custom(x=1).replace()
    assert type(d) is Custom and d.x == 100
    assert Custom.__dict__["replace"].__qualname__.endswith("Custom.replace")
    assert Custom(x=1).replace(x=4).x == 4


def test_copy_replace_protocol() -> None:
    """__replace__ (what copy.replace calls on Python 3.13+) is replace()."""
    p = _Conv(x=1.0)
    q = p.__replace__(n=3)
    assert type(q) is _Conv and q.n == 3 and q.x is p.x
    import copy

    if hasattr(copy, "replace"):
        assert copy.replace(p, n=4).n == 4


def test_code_is_generated_once_per_class_not_per_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    """Construction, flatten, unflatten and replace compile their code once per class."""
    from jaxstruct.core import _codegen

    compiled: list[str] = []
    real_compile = compile

    def counting_compile(source: str, filename: str, mode: str) -> object:
        compiled.append(filename)
        return real_compile(source, filename, mode)

    monkeypatch.setattr(_codegen, "compile", counting_compile, raising=False)

    class Once(js.Struct):
        x: object
        tag: str = js.field(static=True, default="t")

    for i in range(20):
        obj = Once(x=jnp.full(2, float(i)))
        leaves, treedef = jax.tree_util.tree_flatten(obj)
        back = jax.tree_util.tree_unflatten(treedef, leaves)
        jax.tree_util.tree_flatten_with_path(back.replace(tag="u"))
    assert sorted(name.rsplit(".", 1)[1] for name in compiled) == [
        "__init__>",
        "flat_of>",
        "replace>",
        "unflatten>",
    ]


def _attributes_out_of_line(obj: object) -> bool:
    # CPython (3.11+) keeps instance attributes in an inline array while it can;
    # once they live in a real per-instance dict, reads may take a slower path.
    # The garbage collector tells the two apart on every version: it reports the
    # attribute values themselves while they are inline, the dict once they are not.
    import gc

    return any(type(r) is dict for r in gc.get_referents(obj))


def test_cached_forms_keep_attributes_inline() -> None:
    """Flattening (with and without paths) and tree_map leave every instance's attributes inline.

    On CPython 3.11 and 3.12 materialising an instance's __dict__ makes its reads several times
    slower.
    """

    class Inline(js.Struct):
        x: object
        y: object
        n: int = js.field(static=True, default=0)

    items = [Inline(x=float(i), y=(i,)) for i in range(200)]
    for obj in items:
        jax.tree_util.tree_flatten(obj)
        jax.tree_util.tree_flatten_with_path(obj)
    back = jax.tree_util.tree_map(lambda v: v, items)
    assert not any(_attributes_out_of_line(o) for o in [*items, *back])


def test_inline_probe_sees_attributes_moved_out() -> None:
    """The probe of the test above reports attributes moved into a real dict, on every version."""

    class Inline(js.Struct):
        x: object
        y: object

    asked, replaced = Inline(x=1.0, y=(2,)), Inline(x=1.0, y=(2,))
    assert not _attributes_out_of_line(asked)
    # Asking for __dict__ moves the attributes out on 3.11 and 3.12, where that
    # slows reads (what the test above guards against); 3.13 builds the dict on
    # top of the inline array and reads stay as fast.
    vars(asked)
    assert _attributes_out_of_line(asked) is (sys.version_info < (3, 13))
    # Replacing __dict__ moves them out on every version.
    object.__setattr__(replaced, "__dict__", dict(vars(replaced)))
    assert _attributes_out_of_line(replaced)


def test_fields_named_like_parameters() -> None:
    """Fields called self, cls or type work in every generated and generic method."""

    class Odd(js.Struct):
        self: int
        cls: int = 2
        type: object = js.field(static=True, default="t")
        late: int = js.field(init=False, default=7)

    odd = Odd(self=1)
    assert (odd.self, odd.cls, odd.type, odd.late) == (1, 2, "t", 7)
    assert Odd(5).self == 5
    first = odd.replace(self=3, type=int)  # the general path, which compiles the fast one
    again = odd.replace(self=4, late=8)  # the compiled one
    assert (first.self, first.type, again.self, again.late) == (3, int, 4, 8)
    assert jax.tree_util.tree_leaves(again) == [4, 2, 8]

    class Hand(js.Struct):
        self: int
        other: int = 0

        def __init__(self, v: int) -> None:
            super().__init__(self=v, other=v + 1)

    hand = Hand(4)
    assert (hand.self, hand.other) == (4, 5)
    assert hand.replace(self=6).self == 6


# -- how generated code stores fields (issue 24, item 1) ---------------------------------------


def _generated(cls: type) -> dict[str, object]:
    """The compiled __init__, replace and unflatten of ``cls`` (each used once first)."""
    obj = cls(x=jnp.ones(2), y=1.0)
    obj.replace(y=2.0)
    leaves, treedef = jax.tree_util.tree_flatten(obj)
    jax.tree_util.tree_unflatten(treedef, leaves)
    layout = cls.__dict__["__struct_layout__"]
    return {
        "__init__": cls.__dict__["__init__"],
        "replace": cls.__dict__["replace"],
        "unflatten": layout.unflatten,
    }


def test_generated_code_stores_into_the_instance_dict_from_python_313() -> None:
    """From CPython 3.13 on, __init__, replace and unflatten fill __dict__ directly.

    There the dict is built on top of the inline attributes, so reads stay fast;
    on 3.11 and 3.12 it would move them out, so those keep object.__setattr__.
    """

    class Stored(js.Struct):
        x: object
        y: object
        tag: str = js.field(static=True, default="s")

    for name, fn in _generated(Stored).items():
        code = fn.__code__  # type: ignore[attr-defined]
        uses_dict = "__dict__" in code.co_names
        assert uses_dict is (sys.version_info >= (3, 13)), name


@pytest.fixture(params=[False, True], ids=["setattr", "dict"])
def store_in_dict(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Generate code storing fields one way or the other, whatever the interpreter."""
    from jaxstruct.core import _codegen

    monkeypatch.setattr(_codegen, "STORE_IN_DICT", request.param)
    return request.param


def _probe_class(monkeypatch: pytest.MonkeyPatch, suffix: str) -> type:
    """A struct class pickle can find (module-level name), defined under the current store."""

    class Probe(js.Struct):
        x: object
        y: object
        tag: str = js.field(static=True, default="p")
        note: object = js.field(pytree=False, default=None)

    name = f"_Probe_{suffix}"
    Probe.__qualname__ = Probe.__name__ = name
    monkeypatch.setattr(sys.modules[__name__], name, Probe, raising=False)
    return Probe


def test_both_stores_make_the_same_frozen_instances(
    store_in_dict: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either store gives equal instances with the same vars(), frozen, copyable and picklable."""
    import copy
    import pickle

    probe = _probe_class(monkeypatch, "dict" if store_in_dict else "setattr")
    made = probe(x=1.0, y=(2,), tag="t")
    replaced = made.replace(y=(3,))
    assert list(vars(made)) == ["x", "y", "tag", "note"]
    assert list(vars(replaced)) == ["x", "y", "tag", "note"]
    leaves, treedef = jax.tree_util.tree_flatten(made)
    unflattened = jax.tree_util.tree_unflatten(treedef, leaves)
    assert list(vars(unflattened)) == ["x", "y", "tag", "note", "_jaxstruct_flat"]
    assert unflattened == made and replaced.y == (3,) and replaced.x == 1.0
    for obj in (made, replaced, unflattened):
        for again in (copy.copy(obj), copy.deepcopy(obj), pickle.loads(pickle.dumps(obj))):
            assert type(again) is probe and again == obj
            assert jax.tree_util.tree_leaves(again) == jax.tree_util.tree_leaves(obj)
            with pytest.raises(js.FrozenStructError):
                again.x = 5
        with pytest.raises(js.FrozenStructError, match="'x'"):
            obj.x = 5
        with pytest.raises(js.FrozenStructError):
            obj.extra = 5
        with pytest.raises(js.FrozenStructError):
            del obj.y
        assert obj.x == 1.0


def test_construction_replace_and_unflatten_keep_attributes_inline() -> None:
    """However an instance is made (and then flattened), its attributes stay in the inline array.

    On 3.13+ the dict the generated code fills sits on top of that array; on
    3.11 and 3.12 no dict is made at all.
    """

    class Inline(js.Struct):
        x: object
        y: object
        n: int = js.field(static=True, default=0)

    made = [Inline(x=float(i), y=(i,)) for i in range(100)]
    replaced = [obj.replace(n=1) for obj in made]
    back = jax.tree_util.tree_map(lambda v: v, made)
    for obj in [*made, *replaced, *back]:
        jax.tree_util.tree_flatten_with_path(obj)
    assert not any(_attributes_out_of_line(o) for o in [*made, *replaced, *back])


def test_a_descriptor_named_like_a_field_keeps_setattr_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A property in the MRO named like a field still sees its setter run (no dict store)."""
    from jaxstruct.core import _codegen

    monkeypatch.setattr(_codegen, "STORE_IN_DICT", True)

    class Scaled:
        @property
        def a(self) -> int:
            return self.__dict__["_a"]

        @a.setter
        def a(self, value: int) -> None:
            self.__dict__["_a"] = value * 10

    class Uses(Scaled, js.Struct):
        a: int

    layout = Uses.__dict__["__struct_layout__"]
    assert not _codegen.stores_in_dict(Uses, layout)
    assert Uses(a=1).a == 10  # the setter ran, as object.__setattr__ makes it
