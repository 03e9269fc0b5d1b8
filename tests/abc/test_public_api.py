"""testing and abc use core's public API; core's mypy plugin names no private module of abc."""

from __future__ import annotations

from pathlib import Path

import jaxstruct.abc
import jaxstruct.core.mypy_plugin as plugin
import jaxstruct.testing

_SOURCES = [
    path
    for package in (jaxstruct.abc, jaxstruct.testing)
    for path in Path(package.__file__).parent.glob("*.py")
]


def test_abc_and_testing_read_no_private_core_attribute() -> None:
    """No module of abc or testing reads core's private layout or its messages' wording."""
    for path in _SOURCES:
        text = path.read_text()
        assert "__struct_layout__" not in text, path.name
        assert "jaxstruct.core._" not in text, path.name
        assert "while converting" not in text and "; pass a value" not in text, path.name


def test_mypy_plugin_names_the_public_abstract_var() -> None:
    """The plugin's AbstractVar is the public name, which abc exports."""
    assert plugin.ABSTRACT_VAR == "jaxstruct.abc.AbstractVar"
    assert "jaxstruct.abc._" not in Path(plugin.__file__).read_text()
    assert hasattr(jaxstruct.abc, "AbstractVar")
