"""A private mosquitto for tests: moved to labctl.testing.mosquitto (shipped, for labs' own tests too)."""

from __future__ import annotations

from labctl.testing.mosquitto import Mosquitto

__all__ = ["Mosquitto"]
