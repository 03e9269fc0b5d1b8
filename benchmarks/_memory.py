"""What the benchmarks read from the OS about memory, and the aligned buffers of their limits."""

from __future__ import annotations

from typing import Any

__all__ = ["aligned", "reset_peak", "status"]


def status(field: str) -> int:
    """Return a byte count from ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...)."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Set ``VmHWM`` to the current RSS (a no-op on kernels without ``clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:  # pragma: no cover - old kernels: the peak then includes the warm-up
        pass


def aligned(nbytes: int) -> Any:
    """Return an uninitialised 64-byte-aligned uint8 buffer, which JAX adopts without a copy."""
    import numpy as np

    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + nbytes]
