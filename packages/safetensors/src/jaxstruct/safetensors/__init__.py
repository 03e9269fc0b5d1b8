"""The ``safetensors`` file format for jaxstruct: tensors by tree path, safe to load.

Installing ``jaxstruct-safetensors`` registers the format through the
``jaxstruct.io`` entry-point group; ``jaxstruct.io.export(value,
"model.safetensors")`` writes it, and ``jaxstruct.io.load`` reads it back, or
reads a safetensors file another tool wrote into a ``target=``.
"""

from ._format import SafetensorsFormat

__all__ = ["SafetensorsFormat"]
