"""The version of labctl (one source: pyproject reads it from here)."""

__version__ = "0.1.0"
DISTRIBUTION = "labctl-ocs"
"""labctl's distribution name (`labctl` on the public package index is an unrelated project); the import
name and the command are `labctl`."""
