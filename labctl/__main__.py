"""`python -m labctl`: the `labctl` command, for an environment whose scripts directory is not on PATH."""

from __future__ import annotations

from labctl.cli import main

if __name__ == "__main__":
    main()
