"""Tree paths are a faithful encoding of their steps (issue 47): every step kept, empty ones
included, a path is ``join_path`` of its steps, and checkpoints named by the earlier
rule still load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jaxstruct.io as jio
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

FIXTURES = Path(__file__).parent / "fixtures" / "paths_before_0_2"

# Steps that escaping must keep apart: empty, separators, escapes written out literally.
STEPS = st.sampled_from(["", "a", ".", "%", "/", "%2E", "%25", "~", "a.b", "root", "%.a", "0"])


def split_path(path: str) -> list[str]:
    """The steps of a path (the inverse of join_path, for str steps), as the docs say."""
    if path == "":
        return []
    out = []
    for step in path.split("."):
        if step == "%":
            out.append("")
        else:
            out.append(step.replace("%2E", ".").replace("%2F", "/").replace("%25", "%"))
    return out


def _paths(value: Any) -> dict[str, str]:
    return jio.array_paths(jio.to_state_dict(value))


def test_a_leading_empty_step_is_kept() -> None:
    """{"": {"a": x}} and {"a": x} give x different paths; the path is join_path of its steps."""
    x = np.ones(1)
    assert _paths({"": {"a": x}}) == {"a0": "%.a"} == {"a0": jio.join_path(["", "a"])}
    assert _paths({"a": x}) == {"a0": "a"}
    assert _paths({"a": {"": x}}) == {"a0": jio.join_path(["a", ""])} == {"a0": "a.%"}


def test_the_root_and_a_single_step_differ() -> None:
    """An array at the root has the empty path (no step); the keys "" and "root" differ."""
    x = np.ones(1)
    assert _paths(x) == {"a0": ""} == {"a0": jio.join_path([])}
    assert _paths({"": x}) == {"a0": "%"}
    assert _paths({"root": x}) == {"a0": "root"}


def test_walk_names_nodes_below_an_empty_key() -> None:
    """walk() keeps empty steps as array_paths does."""
    state = jio.to_state_dict({"": {"b": [np.ones(1)]}})
    assert [n.path for n in jio.walk(state)] == ["", "%", "%.b", "%.b.0"]


@given(st.lists(STEPS, max_size=5))
def test_join_path_is_injective(steps: list[str]) -> None:
    """join_path loses no step: its steps come back from the path, so no two lists of steps
    share a path."""
    assert split_path(jio.join_path(steps)) == steps


def _trees(depth: int = 3) -> st.SearchStrategy[Any]:
    leaf = st.integers(0, 3).map(lambda n: np.arange(n, dtype=np.int8))
    return st.recursive(
        leaf, lambda inner: st.dictionaries(STEPS, inner, min_size=1, max_size=3), max_leaves=8
    )


@given(_trees())
def test_array_paths_lead_back_to_their_arrays(tree: Any) -> None:
    """Each array's path is join_path of the keys leading to it, and following those keys
    from the root reaches that very array (so distinct places never share a path)."""
    state = jio.to_state_dict(tree)
    paths = jio.array_paths(state)
    assert len(set(paths.values())) == len(paths)
    for key, path in paths.items():
        node = tree
        for step in split_path(path):
            node = node[step]
        assert node is state["array_data"][key] or np.array_equal(node, state["array_data"][key])
        assert jio.join_path(split_path(path)) == path


@pytest.mark.parametrize("suffix", [".tar", ".safetensors"])
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("root", np.arange(3.0)),
        (
            "emptykeys",
            {"": {"a": np.arange(3.0), "": np.arange(2)}, "a": np.ones(2, np.int8)},
        ),
    ],
)
def test_files_named_by_the_earlier_rule_still_load(name: str, suffix: str, expected: Any) -> None:
    """Files written when a root array was 'root' and leading empty steps were dropped (the
    tar example names members by path, safetensors tensors) load with the same values."""
    got = jio.load(FIXTURES / f"{name}{suffix}")
    if isinstance(expected, np.ndarray):
        assert np.array_equal(got, expected) and got.dtype == expected.dtype
        return
    assert np.array_equal(got[""]["a"], expected[""]["a"])
    assert np.array_equal(got[""][""], expected[""][""])
    assert np.array_equal(got["a"], expected["a"]) and got["a"].dtype == np.int8


def test_the_tar_example_names_members_by_the_new_paths(tmp_path: Path) -> None:
    """A new archive names members by the paths array_paths gives now, and loads back."""
    import tarfile

    value = {"": {"a": np.arange(3.0)}, "a": np.ones(2, np.int8)}
    path = jio.export(value, tmp_path / "p.tar")
    with tarfile.open(path) as archive:
        assert archive.getnames() == ["manifest.json", "%.a.bin", "a.bin"]
    assert np.array_equal(jio.load(path)[""]["a"], value[""]["a"])
