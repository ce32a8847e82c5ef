"""labctl.core.sched: the controller's loop at SCHED_FIFO while an experiment runs, back after, refused in
one line where not permitted; a figure worker drops what it inherited. The system calls are replaced by a
recorder here (tests/integration/test_rt_priority.py makes them for real, as root)."""

from __future__ import annotations

import os

import pytest

from labctl.core import sched
from labctl.core.errors import HardwareError, InputError


class FakeScheduler:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, refuse: bool = False) -> None:
        self.policy, self.priority, self.calls = os.SCHED_OTHER, 0, []
        self.refuse = refuse
        monkeypatch.setattr(os, "sched_getscheduler", lambda pid: self.policy)
        monkeypatch.setattr(os, "sched_getparam", lambda pid: os.sched_param(self.priority))
        monkeypatch.setattr(os, "sched_setscheduler", self.set)

    def set(self, pid: int, policy: int, param: os.sched_param) -> None:
        self.calls.append((pid, policy, param.sched_priority))
        if self.refuse and policy == os.SCHED_FIFO:
            raise PermissionError(1, "Operation not permitted")
        self.policy, self.priority = policy, param.sched_priority


def test_realtime_inside_the_block_and_back_after(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeScheduler(monkeypatch)
    with sched.realtime(10) as record:
        assert record == {"policy": "SCHED_FIFO", "priority": 10}
        assert (fake.policy, fake.priority) == (os.SCHED_FIFO, 10)
    assert (fake.policy, fake.priority) == (os.SCHED_OTHER, 0)
    with pytest.raises(RuntimeError), sched.realtime(3):
        raise RuntimeError("the run failed")
    assert fake.policy == os.SCHED_OTHER  # restored on the way out of a failure too
    with sched.realtime(None) as record:
        assert record is None
    assert len(fake.calls) == 4  # nothing for None


def test_not_permitted_is_one_line_before_anything_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeScheduler(monkeypatch, refuse=True)
    with pytest.raises(HardwareError) as caught:
        sched.permitted(10)
    assert "\n" not in str(caught.value) and "CAP_SYS_NICE" in str(caught.value)
    assert fake.policy == os.SCHED_OTHER
    for bad in (0, 100):
        with pytest.raises(InputError, match=r"1\.\.99"):
            sched.check_priority(bad)


def test_a_worker_drops_an_inherited_realtime_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeScheduler(monkeypatch)
    fake.policy, fake.priority = os.SCHED_FIFO, 10
    sched.ordinary()
    assert (fake.policy, fake.priority) == (os.SCHED_OTHER, 0)
    sched.ordinary()  # already ordinary: no call
    assert len(fake.calls) == 1


def test_idle_thread_lowers_only_the_calling_thread() -> None:
    """SCHED_IDLE (or nice +10 where refused) for the thread that asks; the rest of the process as it was."""
    import os
    import threading

    from labctl.core.sched import idle_thread

    got: dict[str, object] = {}

    def worker() -> None:
        got["how"] = idle_thread()
        got["policy"] = os.sched_getscheduler(0)
        got["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert got["how"] in ("idle", "nice")
    if got["how"] == "idle":
        assert got["policy"] == os.SCHED_IDLE
    else:
        assert got["nice"] == min(19, before[1] + 10)
    assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())) == before
