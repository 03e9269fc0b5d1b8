"""The tar format passes jaxstruct's conformance tests for format plugins."""

from jaxstruct.testing import FormatTests
from jaxstruct_plugin_tar import TarFormat


class TestTar(FormatTests):
    """Every promise of a jaxstruct.io format, tested on this plugin's TarFormat."""

    format = TarFormat()
