"""The one host memory budget of the process, and the tickets that hold parts of it.

``JAXSTRUCT_HOST_BUDGET`` (256 MiB by default) bounds the host memory that
jaxstruct's work holds at once in the whole process, for every export running:
copies from accelerators, compressed bytes waiting to be written, staging
buffers, and what plugins reserve (orbax's batches of device-to-host copies,
safetensors' copies). Work takes a :class:`Ticket`, a number of bytes of the
budget, spends within it, and gives it back when it ends.

Waiting never deadlocks: a thread waits for the process's budget only while
it holds none of it. Work nested inside a ticket of the same thread (the
arrays streamed by an export's writer, by a plugin inside
:func:`reserve_host`) takes a part of that ticket instead, and never waits:
it is sized from what is free there. A ticket that ends while something
still holds its bytes (the last view a loop kept) gives them back as they are
freed; if its thread must then wait for the budget, it lets them go first.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator

from jaxstruct.registry import SerializationError

from . import _process

BUDGET_ENV = "JAXSTRUCT_HOST_BUDGET"
DEFAULT_BUDGET = 256 << 20
MIN_BUDGET = 4096
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(?:i?b)?\s*$", re.IGNORECASE)

#: Tests: called with the bytes of the budget held in the process each time that changes
#: (what tickets took, plus anything a ticket holds beyond its size).
WATCH: Callable[[int], None] | None = None


def host_budget() -> int:
    """Return the process's host memory budget in bytes (``JAXSTRUCT_HOST_BUDGET``).

    Read from the environment each time an export starts: a number of bytes with
    an optional ``K``, ``M`` or ``G`` suffix, at least 4 KiB; 256 MiB when unset.
    Copies from accelerators, compression buffers and staging of every export
    running, and what plugins reserve (:func:`reserve_host`), hold at most this
    much host memory together.

    Raises:
        SerializationError: the variable is set to something that is not such a size.

    Example:
        >>> import jaxstruct.io as jio
        >>> jio.host_budget() >= 4096  # 256 MiB unless JAXSTRUCT_HOST_BUDGET says otherwise
        True
    """
    text = os.environ.get(BUDGET_ENV)
    if text is None or not text.strip():
        return DEFAULT_BUDGET
    found = _SIZE.match(text)
    size = int(found.group(1)) * _UNITS[found.group(2).lower()] if found else -1
    if size < MIN_BUDGET:
        raise SerializationError(
            f"{BUDGET_ENV}={text!r} is not a host memory budget: expected a number of bytes "
            f"of at least {MIN_BUDGET}, optionally with a K, M or G suffix (e.g. 256M); "
            "fix it or unset it for the default of 256 MiB"
        )
    return size


class _Account:
    """What the process's tickets hold together."""

    def __init__(self) -> None:
        self.used = 0  # the sizes of the tickets taken from the process
        self.excess = 0  # bytes tickets hold beyond their sizes (never, unless a bug)
        self.waiting = 0  # threads waiting for room
        self.cond = threading.Condition()

    def take(self, want: int, least: int, limit: int, *, wait: bool) -> int:
        """Take up to ``want`` bytes and at least ``least`` (at most ``limit`` in all held);
        0 when they do not fit and ``wait`` is false."""
        least = min(least, limit)
        with self.cond:
            if self.used + least > limit:
                if not wait:
                    return 0
                _drop_lingering(self)
                self.waiting += 1
                try:
                    while self.used + least > limit:
                        self.cond.wait()
                finally:
                    self.waiting -= 1
            got = max(least, min(want, limit - self.used))
            self.used += got
            held = self.used + self.excess
        _report(held)
        return got

    def give(self, n: int) -> None:
        with self.cond:
            self.used -= n
            held = self.used + self.excess
            self.cond.notify_all()
        _report(held)

    def over(self, n: int) -> None:
        """Record ``n`` more (or fewer) bytes held beyond tickets' sizes."""
        with self.cond:
            self.excess += n
            held = self.used + self.excess
        _report(held)


def _report(held: int) -> None:
    watch = WATCH
    if watch is not None:
        watch(held)


_ACCOUNT = _Account()


class Ticket:
    """Bytes taken from the process's budget (or from an enclosing ticket) for one piece
    of work: it spends them (:meth:`take`, :meth:`add`, :meth:`free`) and gives them back
    when it ends (:meth:`end`), the part still held as it is freed."""

    def __init__(self, size: int, parent: Ticket | None, account: _Account, limit: int) -> None:
        self.size = size
        self.held = 0
        self.parent = parent
        self.account = account  # the process's account it came from (a fork makes another)
        self.limit = limit  # the budget when it was taken
        self.want = size
        self.ended = False
        self.counted = True  # False once let go of by a thread about to wait (see _drop_lingering)
        self.lock = threading.Lock()

    @property
    def room(self) -> int:
        """Bytes of the ticket not held."""
        return self.size - self.held

    def take(self, n: int) -> bool:
        """Hold ``n`` bytes more if they fit; whether they did."""
        with self.lock:
            if self.held + n > self.size:
                return False
            self.held += n
            return True

    def take_up_to(self, want: int) -> int:
        """Hold up to ``want`` bytes more, as many as are free; how many."""
        with self.lock:
            got = max(0, min(want, self.size - self.held))
            self.held += got
            return got

    def add(self, n: int) -> None:
        """Hold ``n`` bytes more, which the caller made room for (any excess is reported)."""
        with self.lock:
            before = max(0, self.held - self.size)
            self.held += n
            over = max(0, self.held - self.size) - before if self.counted else 0
        if over:
            self._over(over)

    def free(self, n: int) -> None:
        """Stop holding ``n`` bytes; once ended, they go back where the ticket came from."""
        with self.lock:
            before = max(0, self.held - self.size)
            self.held -= n
            under = before - max(0, self.held - self.size) if self.counted else 0
            back = 0
            if self.ended and self.held < self.size:
                back = self.size - max(self.held, 0)
                self.size -= back
        if under:
            self._over(-under)
        if back:
            self._give_back(back)

    def end(self) -> None:
        """The work is done: give back what is not held now, the rest as it is freed."""
        with self.lock:
            if self.ended:
                return
            self.ended = True
            back = max(0, self.size - self.held)
            self.size -= back
            lingering = self.size > 0 and self.parent is None and self.counted
        if back:
            self._give_back(back)
        if lingering:
            found = _lingering()
            found[:] = [t for t in found if t.size > 0 and t.counted]  # the ones still held
            found.append(self)

    def rebalance(self, least: int) -> None:
        """Between steps of long work holding a ticket of the process: give back what is
        not held (down to ``least``) while other threads wait, or take more (up to what
        the ticket was asked for) while none do."""
        if self.parent is not None or self.ended:
            return
        account = self.account
        if account.waiting:
            with self.lock:
                back = max(0, self.size - max(least, self.held))
                self.size -= back
            if back:
                account.give(back)
        elif self.size < self.want:
            got = account.take(self.want - self.size, 0, self.limit, wait=False)
            if got:
                with self.lock:
                    self.size += got

    def _over(self, n: int) -> None:
        ticket: Ticket = self
        while ticket.parent is not None:
            ticket = ticket.parent
        ticket.account.over(n)

    def _give_back(self, n: int) -> None:
        if self.parent is not None:
            self.parent.free(n)
        elif self.counted:
            self.account.give(n)


_LOCAL = threading.local()


def current() -> Ticket | None:
    """The innermost ticket this thread works within, if any."""
    return getattr(_LOCAL, "current", None)


@contextlib.contextmanager
def within(ticket: Ticket) -> Iterator[Ticket]:
    """Make ``ticket`` the one this thread's nested work takes its bytes from."""
    previous = current()
    _LOCAL.current = ticket
    try:
        yield ticket
    finally:
        _LOCAL.current = previous


def _lingering() -> list[Ticket]:
    found = getattr(_LOCAL, "lingering", None)
    if found is None:
        found = _LOCAL.lingering = []
    return found


def _drop_lingering(account: _Account) -> None:
    """Before this thread waits: stop counting the bytes its ended tickets still hold
    (views its code keeps), which only this thread could free. Called with the lock held."""
    found = _lingering()
    for ticket in found:
        with ticket.lock:
            if not ticket.counted:
                continue
            ticket.counted = False
            back = ticket.size
            ticket.size = 0
            over = max(0, ticket.held - back)
        if ticket.account is account:
            account.used -= back
            account.excess -= over
    found.clear()


def take(want: int, least: int) -> Ticket:
    """A ticket of up to ``want`` bytes and, where the budget allows, at least ``least``.

    Inside another ticket of this thread it is a part of that one, as much of
    ``want`` as is free there (maybe less than ``least``, maybe nothing): it never
    waits. Otherwise it comes from the process's budget (at most all of it),
    waiting until ``least`` fits beside what other threads hold.
    """
    parent = current()
    if parent is not None:
        got = parent.take_up_to(want)
        ticket = Ticket(got, parent, parent.account, parent.limit)
    else:
        limit = host_budget()
        account = _ACCOUNT
        got = account.take(min(want, limit), min(least, want, limit), limit, wait=True)
        ticket = Ticket(got, None, account, limit)
        ticket.want = min(want, limit)
    return ticket


@_process.at_fork
def _forget_in_child() -> None:
    """After a fork: the parent's tickets belong to threads the child does not have."""
    global _ACCOUNT
    _ACCOUNT = _Account()
    _LOCAL.lingering = []


@contextlib.contextmanager
def reserve_host(nbytes: int) -> Iterator[None]:
    """Hold ``nbytes`` of the process's host memory budget for the ``with`` block.

    Waits until they fit beside what other threads hold (exports streaming from
    accelerators, compressing, other plugins' reservations), so that all of
    jaxstruct together stays within ``JAXSTRUCT_HOST_BUDGET``. Reserve before
    making host copies or buffers that are not otherwise counted, and hold the
    reservation while they live. Inside the block, :func:`host_chunks` in this
    thread takes its pieces from the reservation (reserve room for them too), and
    a nested ``reserve_host`` takes its bytes from this one, without waiting.

    Args:
        nbytes: bytes to hold; at most the whole budget.

    Raises:
        SerializationError: ``nbytes`` is more than the whole budget (hold less at a
            time, e.g. stream arrays with :func:`host_chunks`, or raise
            ``JAXSTRUCT_HOST_BUDGET``), or, nested, more than the enclosing
            reservation has free.
        ValueError: ``nbytes`` is negative.

    Example:
        >>> import numpy as np
        >>> import jaxstruct.io as jio
        >>> with jio.reserve_host(1 << 20):
        ...     staging = np.empty(1 << 20, np.uint8)  # counted against the budget here
    """
    if nbytes < 0:
        raise ValueError(f"reserve_host: cannot reserve {nbytes} bytes")
    parent = current()
    if parent is not None:
        if not parent.take(nbytes):
            raise SerializationError(
                f"reserve_host({nbytes}): the enclosing reservation of this thread has only "
                f"{max(0, parent.room)} bytes free, and a nested reservation cannot wait for "
                "its own thread; reserve more in the outer block, or less here"
            )
        ticket = Ticket(nbytes, parent, parent.account, parent.limit)
    else:
        limit = host_budget()
        if nbytes > limit:
            raise SerializationError(
                f"reserve_host({nbytes}): more host memory at once than {BUDGET_ENV} allows "
                f"({limit} bytes); hold less at a time (jaxstruct.io.host_chunks streams an "
                f"array in pieces within the budget), or raise {BUDGET_ENV}"
            )
        ticket = take(nbytes, nbytes)
    try:
        with within(ticket):
            yield
    finally:
        ticket.end()
