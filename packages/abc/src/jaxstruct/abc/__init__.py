"""Placeholder; filled in by its own issue."""

__all__: list[str] = []
