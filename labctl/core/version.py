"""The version of labctl (one source: pyproject reads it from here)."""

__version__ = "0.1.0"
