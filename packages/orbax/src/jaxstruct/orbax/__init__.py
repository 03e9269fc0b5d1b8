"""The ``orbax`` checkpoint format for jaxstruct: sharded, multi-process and async, on orbax.

Installing ``jaxstruct-orbax`` registers the format through the
``jaxstruct.io`` entry-point group; use it with
``jaxstruct.io.export(value, path, format="orbax")`` and ``jaxstruct.io.load``.
"""

from ._format import OrbaxFormat
from ._gcs_settings import configure_gcs
from ._stores import configure_s3

__all__ = ["OrbaxFormat", "configure_gcs", "configure_s3"]
