"""Network namespace helpers: enter one from a thread, open sockets inside it, create, list and sweep.

`setns(2)` with CLONE_NEWNET moves only the calling thread, and a socket keeps the namespace it was created
in, so probes enter a namespace just long enough to open their sockets and then use them from the event
loop thread like any other. Every name labctl creates starts with a prefix (`cleanup(prefix)` removes them
all): `lc-<layout hash>-` for a fabric started with `labctl emulate fabric up`, `lr-<pid>-` for one a run
brought up itself, `lt<pid>-` in tests.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from labctl.core.errors import HardwareError, InputError
from labctl.linux.readonly import check_write

CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = Path("/run/netns")
_NAME_OK = re.compile(r"^[A-Za-z0-9_.-]+$")

_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def netns_path(name: str) -> Path:
    if not _NAME_OK.match(name) or name in (".", ".."):
        raise InputError(f"bad network namespace name {name!r} (letters, digits, '.', '_', '-')")
    return NETNS_RUN_DIR / name


@contextmanager
def entered(name: str | None) -> Iterator[None]:
    """Run the calling thread inside network namespace `name` (None: stay) for the block."""
    if name is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            target = os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise InputError(f"network namespace {name!r} does not exist") from None
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


def socket_in(name: str | None, family: int, kind: int, proto: int = 0) -> socket.socket:
    with entered(name):
        return socket.socket(family, kind | socket.SOCK_CLOEXEC, proto)


def sockets_in_netns(
    netns: str | None, factories: Sequence[Callable[[], socket.socket]]
) -> list[socket.socket]:
    """Create sockets inside a named network namespace. A socket stays in the namespace it was created in,
    so only a short-lived helper thread enters the namespace (setns is per thread); this process and
    its event loop stay where they are."""
    if netns is None:
        return [f() for f in factories]
    path = netns_path(netns)  # a bad name is one clear InputError, not a failed setns
    if not path.exists():
        raise InputError(f"network namespace {netns!r} does not exist ({path})")
    result: list[socket.socket] = []
    failure: list[BaseException] = []

    def enter_and_create() -> None:
        try:
            with entered(netns):
                result.extend(f() for f in factories)
        except BaseException as e:  # handed to the caller's thread
            failure.append(e)

    worker = threading.Thread(target=enter_and_create, name=f"netns:{netns}")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return result


def open_fd(name: str) -> int:
    """An fd referring to namespace `name` (for IFLA_NET_NS_FD); the caller closes it."""
    return os.open(netns_path(name), os.O_RDONLY | os.O_CLOEXEC)


def list_netns(prefix: str = "") -> list[str]:
    try:
        names = os.listdir(NETNS_RUN_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


def exists(name: str) -> bool:
    return netns_path(name).exists()


def create(name: str) -> None:
    from pyroute2 import netns as pr_netns

    if exists(name):
        raise HardwareError(f"network namespace {name!r} already exists")
    pr_netns.create(name)


def remove(name: str) -> None:
    from pyroute2 import netns as pr_netns

    try:
        pr_netns.remove(name)
    except OSError as e:
        if e.errno not in (errno.ENOENT, errno.EINVAL):
            raise


def cleanup(prefix: str) -> list[str]:
    """Remove every network namespace whose name starts with `prefix` (and with it every link inside)."""
    if not prefix:
        raise ValueError("cleanup needs a non-empty prefix")
    removed = []
    for name in list_netns(prefix):
        remove(name)
        removed.append(name)
    return removed


def write_sysctl(name: str | None, key: str, value: str) -> None:
    """Set a per-namespace sysctl (e.g. net/ipv4/conf/all/arp_ignore) inside namespace `name`."""
    check_write(f"write sysctl {key}")
    with entered(name), open(Path("/proc/sys") / key, "w") as f:
        f.write(value)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_run_prefixes(marker: str = "lr-") -> list[str]:
    """Prefixes `<marker><pid>-` of fabrics whose owning process is gone (leftovers of killed runs)."""
    out = set()
    for name in list_netns(marker):
        m = re.match(rf"^({re.escape(marker)}(\d+)-)", name)
        if m and not pid_alive(int(m[2])):
            out.add(m[1])
    return sorted(out)
