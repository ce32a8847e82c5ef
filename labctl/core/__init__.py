"""The core layer: what every other part of labctl stands on, importing nothing above it.

The event spine (`events`), integer-ns time on one timebase (`clock`),
the error types (`errors`), atomic file writes (`fileio`), YAML that remembers file:line (`yamlio`), the
name -> entry tables of every registry (`registry`), optional dependencies (`extras`), the version.
"""
