"""The controller's recovery tracker, on events it is handed. The controller end to end on the simulated lab
is tests/integration/test_controller.py."""

from __future__ import annotations

from labctl.core.events import Event
from labctl.run.recovery import RecoveryTracker


def test_recovery_tracker_ignores_the_old_circuit() -> None:
    progress: list[int] = []
    tracker = RecoveryTracker(
        {"a": "new-a", "b": "new-b", "c": "new-c"}, t0_ns=100, on_progress=progress.append
    )
    tracker(Event(t_ns=50, kind="traffic.lost", source="a"))  # before t0
    tracker(Event(t_ns=110, kind="traffic.ok", source="a", meta={"peer": "old-a"}))  # old circuit still up
    tracker(Event(t_ns=115, kind="traffic.lost", source="a", meta={"peer": "old-a"}))  # a spurious loss...
    tracker(
        Event(t_ns=118, kind="traffic.ok", source="a", meta={"peer": "old-a"})
    )  # ...then the old one again
    assert tracker.pending == {"a", "b", "c"}
    tracker(Event(t_ns=130, kind="traffic.ok", source="a", meta={"peer": "new-a"}))
    # A probe that names no peer: an ok counts only after a carrier-up or a loss seen after t0.
    tracker(Event(t_ns=135, kind="traffic.ok", source="b"))
    assert "b" in tracker.pending
    tracker(Event(t_ns=140, kind="carrier", source="b", value=1))
    tracker(Event(t_ns=150, kind="traffic.ok", source="b"))
    tracker(Event(t_ns=160, kind="traffic.ok", source="c", meta={"peer": "new-c"}))
    assert tracker.done.is_set()
    assert progress == [1, 2, 3]


def test_recovery_tracker_judges_the_timeout_in_event_time() -> None:
    """A busy loop may deliver an ok stamped after the deadline before the timeout fires: still too late."""
    tracker = RecoveryTracker(
        {"a": "new-a", "b": "new-b"}, t0_ns=100, on_progress=lambda _: None, deadline_ns=200
    )
    tracker(
        Event(t_ns=200, kind="traffic.ok", source="a", meta={"peer": "new-a"})
    )  # at the deadline: in time
    tracker(Event(t_ns=201, kind="traffic.ok", source="b", meta={"peer": "new-b"}))
    assert tracker.pending == {"b"} and not tracker.done.is_set()
