"""Fuzzing: mutated manifests and archives raise only the documented errors, and never hang.

``JAXSTRUCT_FUZZ_CASES`` sets the number of cases per family (default 600,
so about 2,000 in all); raise it for a longer campaign, for example
``JAXSTRUCT_FUZZ_CASES=100000 uv run pytest tests/io/test_fuzz.py``.
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from jaxstruct.registry import SerializationError

CASES = int(os.environ.get("JAXSTRUCT_FUZZ_CASES", "600"))
ALLOWED = (SerializationError, FileNotFoundError, FileExistsError)
SEED = int(os.environ.get("JAXSTRUCT_FUZZ_SEED", "1234"))


def _value() -> Any:
    return {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "z": np.zeros(64, dtype=np.int64),
        "nested": [1, 2.5, None, (True, b"x"), {"k": {3, 4}}],
        "scalar": np.float16(1.5),
        "big": 2**80,
        "nan": float("nan"),
    }


@contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError("a fuzz case took too long (hang?)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _check(load: Callable[[], Any]) -> None:
    with _deadline(10):
        try:
            load()
        except ALLOWED:
            pass


_JUNK: list[Any] = [
    None,
    True,
    -1,
    0,
    1,
    2,
    10**30,
    1e308,
    -0.0,
    "",
    "x",
    "a0",
    "<f4",
    "|O",
    "struct",
    "list",
    [],
    [0],
    [-1],
    [1, 1],
    {},
    {"a": 0},
    ["int", "0xzz"],
    ["float", "7ff8"],
    "module:Name",
    "os:system",
    ["dict", [0]],
    [[[[]]]],
    "\ud800",
    2**63,
    [2**40],
]


def _mutate_json(value: Any, rng: random.Random) -> Any:
    """Replace, delete or duplicate one random place in a JSON value."""
    value = copy.deepcopy(value)
    places: list[tuple[Any, Any]] = []
    stack = [value]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            for k in cur:
                places.append((cur, k))
                stack.append(cur[k])
        elif isinstance(cur, list):
            for i in range(len(cur)):
                places.append((cur, i))
                stack.append(cur[i])
    for _ in range(rng.randint(1, 3)):
        container, key = rng.choice(places)
        action = rng.random()
        try:
            if action < 0.6:
                container[key] = rng.choice(_JUNK)
            elif action < 0.75 and isinstance(container, list):
                container.insert(key, copy.deepcopy(container[key]))
            elif action < 0.9:
                del container[key]
            else:
                container[key] = copy.deepcopy(rng.choice(places)[0])
        except (IndexError, KeyError):
            pass
    return value


def _flip(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    action = rng.random()
    if action < 0.5:
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
    elif action < 0.7:
        del buf[rng.randrange(len(buf)) :]
    elif action < 0.85:
        i, j = sorted(rng.randrange(len(buf)) for _ in range(2))
        buf[i:i] = buf[i:j]
    else:
        i = rng.randrange(len(buf))
        buf[i : i + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff\xff\xff\x7f"])
    return bytes(buf)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Pristine checkpoints to mutate."""
    root = tmp_path_factory.mktemp("fuzz")
    d = jio.export(_value(), root / "d")
    z = jio.export(_value(), root / "z.zip")
    z_none = jio.export(_value(), root / "n.zip", compression="none")
    return {
        # Without its checksum, so that a mutation reaches the parser, not the checksum.
        "manifest": {
            k: v
            for k, v in json.loads((d / "manifest.json").read_text()).items()
            if k != "checksum"
        },
        "manifest_bytes": (d / "manifest.json").read_bytes(),
        "npz": (d / "arrays.npz").read_bytes(),
        "zip": z.read_bytes(),
        "zip_none": z_none.read_bytes(),
        "state": jio.to_state_dict(_value()),
    }


def test_mutated_manifest_structure(base: dict[str, Any], tmp_path: Path) -> None:
    """Structurally mutated manifests load or raise only the documented errors."""
    rng = random.Random(SEED)
    target = jio.export(_value(), tmp_path / "c")
    for _ in range(CASES):
        mutated = _mutate_json(base["manifest"], rng)
        (target / "manifest.json").write_text(json.dumps(mutated))
        _check(lambda: jio.load(target))


def test_mutated_state_dicts(base: dict[str, Any]) -> None:
    """Mutated in-memory state dicts rebuild or raise only the documented errors."""
    rng = random.Random(SEED + 1)
    state = base["state"]
    json_part = {k: v for k, v in state.items() if k != "array_data"}
    for _ in range(CASES):
        mutated = _mutate_json(json_part, rng)
        if isinstance(mutated, dict):
            mutated["array_data"] = state["array_data"]
        _check(lambda mutated=mutated: jio.from_state_dict(mutated))


@pytest.mark.parametrize("which", ["manifest_bytes", "npz", "zip", "zip_none"])
def test_mutated_bytes(which: str, base: dict[str, Any], tmp_path: Path) -> None:
    """Corrupt bytes in manifest.json, arrays.npz or a .zip raise only the documented errors."""
    rng = random.Random(f"{SEED}-{which}")
    if which.startswith("zip"):
        target = tmp_path / "c.zip"
        member = target
    else:
        target = jio.export(_value(), tmp_path / "c")
        member = target / ("manifest.json" if which == "manifest_bytes" else "arrays.npz")
    for _ in range(CASES // 2):
        member.write_bytes(_flip(base[which], rng))
        _check(lambda: jio.load(target))
        _check(lambda: jio.inspect(target))


_TAGS = [
    "dict",
    "list",
    "tuple",
    "set",
    "frozenset",
    "namedtuple",
    "struct",
    "pytree",
    "codec",
    "array",
    "jaxarray",
    "prngkey",
    "callable",
    "enum",
]


def _children_junk(nodes: list[Any], rng: random.Random) -> Any:
    """A malformed child list: a mapping, a scalar, indices out of range or of junk types."""
    n = len(nodes)
    return rng.choice(
        [
            {"x": 0, "y": 1},
            {str(i): i for i in range(rng.randint(1, 4))},
            {0: 0, 1: 1},
            rng.randrange(n),
            [rng.randrange(-2, n + 2) for _ in range(rng.randint(0, 5))],
            ["a", None, 1.5, [0]],
            None,
            "01",
        ]
    )


def _mutate_kinds(state: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Give one or two nodes another kind's tag, or another shape of children."""
    state = copy.deepcopy(state)
    nodes = state["manifest"]["nodes"]
    for _ in range(rng.randint(1, 2)):
        node = nodes[rng.randrange(len(nodes))]
        action = rng.random()
        if action < 0.4:
            node[0] = rng.choice(_TAGS)
        elif action < 0.8 and len(node) > 1:
            node[rng.randrange(1, len(node))] = _children_junk(nodes, rng)
        else:
            node[0] = rng.choice(_TAGS)
            node[1:] = [_children_junk(nodes, rng) for _ in range(rng.randint(1, 5))]
    return state


def test_mutated_node_kinds_and_children(base: dict[str, Any], tmp_path: Path) -> None:
    """Nodes given another kind or malformed children (a mapping where a list of indices
    belongs, indices out of range) raise only the documented errors: in load, in the
    paths its messages name, in inspect, and in walk."""
    rng = random.Random(SEED + 2)
    state = base["state"]
    json_part = {k: v for k, v in state.items() if k != "array_data"}
    target = jio.export(_value(), tmp_path / "c")
    for case in range(CASES):
        mutated = _mutate_kinds(json_part, rng)
        _check(lambda m=mutated: jio.from_state_dict({**m, "array_data": state["array_data"]}))
        with _deadline(10):
            try:
                list(jio.walk(mutated))
            except ValueError:
                pass
        if case % 4 == 0:
            doc = {**base["manifest"], "manifest": mutated["manifest"]}
            (target / "manifest.json").write_text(json.dumps(doc))
            _check(lambda: jio.load(target))
            _check(lambda: jio.inspect(target))


@pytest.mark.parametrize("tag", [["struct"], {"a": 1}, 7, None])
def test_a_root_tag_that_is_no_string_is_refused_with_load_cls(tag: Any, tmp_path: Path) -> None:
    """load_cls= meeting a root node whose tag is a list or an object (unhashable) raises
    our error, not a TypeError."""
    path = jio.export({"a": 1}, tmp_path / "ck")
    doc = json.loads((path / "manifest.json").read_text())
    doc["manifest"]["nodes"][-1][0] = tag
    (path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(SerializationError):
        jio.load(path, load_cls=dict)
    with pytest.raises(SerializationError):
        jio.inspect(path)
