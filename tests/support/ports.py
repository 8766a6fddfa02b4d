"""Loopback ports for servers the tests start, safe under pytest-xdist.

``bind(("127.0.0.1", 0))`` hands out a port from the kernel's ephemeral range, the same range every
outgoing connection on the machine draws its source port from; a test that binds, closes and hands
the number to a server started seconds later (an apiserver, an etcd, a torchrun rendezvous) races
every connection made meanwhile and, under xdist, every other worker doing the same. Here each
worker draws from a block of its own below the ephemeral range (Linux's default starts at 32768;
the range actually configured is read and avoided), never hands out a port twice in one process,
and checks that the port can be bound right now. What is left is a server of another program
listening there, which the bind check sees.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
import threading
from collections.abc import Iterator

#: The first port of the pool and the size of each xdist worker's block within it.
POOL_START = 10_000
BLOCK = 1_000


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _worker_index() -> int:
    """0 for the main process or xdist's ``gw0``, 1 for ``gw1``..."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = name.removeprefix("gw")
    return int(digits) if digits.isdigit() else 0


def _candidates() -> Iterator[int]:
    """This worker's block, over and over (a port freed by a test may be used again later, after
    every other port of the block; two uses of one port are then thousands of binds apart)."""
    low, high = _ephemeral_range()
    blocks_below = max(1, (low - POOL_START) // BLOCK)
    index = _worker_index()
    if index < blocks_below:
        start = POOL_START + index * BLOCK
        block = list(range(start, start + BLOCK))
    else:  # more workers than blocks below the ephemeral range: blocks above it
        start = high + 1 + (index - blocks_below) * BLOCK
        block = list(range(start, min(start + BLOCK, 65536))) or list(range(POOL_START, POOL_START + BLOCK))
    # Two test processes of one worker index (two pytest runs side by side, a forked child) start at
    # different places in the block.
    offset = os.getpid() % len(block)
    return itertools.cycle(block[offset:] + block[:offset])


_lock = threading.Lock()
_pool: Iterator[int] | None = None
_pid: int | None = None


def _can_bind(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
                return False
            raise
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now and that this process has not handed out
    recently, from this xdist worker's own block (module docstring)."""
    global _pool, _pid
    with _lock:
        if _pool is None or _pid != os.getpid():  # a forked child draws its own sequence
            _pool, _pid = _candidates(), os.getpid()
        for _ in range(BLOCK):
            port = next(_pool)
            if _can_bind(port, host):
                return port
    # The whole block is taken (another program's servers): fall back on the kernel's choice.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
