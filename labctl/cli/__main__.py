"""`python -m labctl.cli`: the same as the `labctl` console script."""

from labctl.cli import main

main()
