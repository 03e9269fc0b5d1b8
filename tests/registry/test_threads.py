"""Registration is thread-safe: concurrent registrations all take effect."""

from __future__ import annotations

import threading

import jax
import jaxstruct.core as js
import jaxstruct.registry as reg

THREADS = 8
PER_THREAD = 15


def _run_concurrently(work: callable) -> list[BaseException]:  # type: ignore[valid-type]
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def target(i: int) -> None:
        barrier.wait()
        try:
            work(i)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=target, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_concurrent_register_pytree_type() -> None:
    """Threads registering different classes at once all end up registered and usable."""
    made: list[type] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        for j in range(PER_THREAD):
            cls = type(
                f"Concurrent_{i}_{j}", (), {"__init__": lambda self, v: setattr(self, "v", v)}
            )
            reg.register_pytree_type(
                cls,
                flatten=lambda o: ((o.v,), None),
                unflatten=lambda aux, ch, cls=cls: cls(ch[0]),
            )
            with lock:
                made.append(cls)

    assert _run_concurrently(work) == []
    assert len(made) == THREADS * PER_THREAD
    for cls in made:
        assert reg.is_registered_pytree_type(cls)
        assert reg.resolve_class(reg.class_ref(cls)) is cls
        assert jax.tree_util.tree_leaves(cls(7)) == [7]


def test_concurrent_struct_definitions() -> None:
    """Threads defining and instantiating struct classes at once all succeed."""
    made: list[type] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        for j in range(PER_THREAD):
            cls = type(
                f"ConcurrentStruct_{i}_{j}",
                (js.Struct,),
                {
                    "__annotations__": {"x": object, "n": int},
                    "n": js.field(static=True, default=j),
                    "__post_init__": lambda self: None,
                },
            )
            obj = cls(x=float(i))
            assert jax.tree_util.tree_map(lambda v: v, obj) == obj
            with lock:
                made.append(cls)

    assert _run_concurrently(work) == []
    assert len(made) == THREADS * PER_THREAD
    for cls in made:
        assert reg.resolve_pytree_spec(cls).cls is cls


def test_concurrent_construction_of_one_class() -> None:
    """Threads constructing instances of one class at once (first use compiles __init__)."""

    class Shared(js.Struct):
        x: int = js.field(converter=int, validator=lambda v: v >= 0)
        y: int = js.field(static=True, init=False, derived=lambda self: self.x * 2)

    results: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        for j in range(PER_THREAD):
            obj = Shared(str(i * 100 + j))
            with lock:
                results.append((obj.x, obj.y))

    assert _run_concurrently(work) == []
    assert sorted(results) == sorted(
        (i * 100 + j, 2 * (i * 100 + j)) for i in range(THREADS) for j in range(PER_THREAD)
    )
