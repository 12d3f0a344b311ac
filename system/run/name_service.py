"""The controller's name service: which address each endpoint name has, and who must hear of it.

A worker registers the names its plan owns (:mod:`system.roles`) and looks up its peers'. A
lookup of a name not registered yet waits here until its owner registers; whoever looked a name
up is a watcher of it, and is told (``moved``) when the name's owner registers anew after a
restart, so a peer that keeps a connection (to the parameter service, say) reconnects at once
instead of waiting out a timeout.

It sends nothing itself: each method returns the messages to send, as (worker id, message)
pairs, so it is tested without a socket and the controller stays the socket's one user.
"""

from __future__ import annotations

from collections.abc import Iterable

from system.run.control_protocol import ControlMessage, LookupResult, Moved

Outgoing = list[tuple[str, ControlMessage]]
"""Messages to send, each to a worker id."""


class NameService:
    def __init__(self) -> None:
        self.endpoints: dict[str, str] = {}
        """Each registered name's current address."""
        self._waiting: dict[str, list[str]] = {}
        """Who asked for a name that has no address yet (its owner not started, or restarting)."""
        self._watchers: dict[str, set[str]] = {}
        self._registered: set[str] = set()
        """Every name that was ever registered: a new registration of one is a move."""

    def register(self, name: str, address: str) -> Outgoing:
        """``name`` is at ``address`` now: the answers to waiting lookups and, if the name had an
        owner before, a ``moved`` to everyone who looked it up."""
        out: Outgoing = []
        if name in self._registered:
            out += [(w, Moved(name, address)) for w in sorted(self._watchers.get(name, ()))]
        self._registered.add(name)
        self.endpoints[name] = address
        return out + self._answer(name)

    def lookup(self, name: str, asker: str) -> Outgoing:
        """``asker`` wants ``name``'s address: answered now if known, else at its registration."""
        self._waiting.setdefault(name, []).append(asker)
        self._watchers.setdefault(name, set()).add(asker)
        return self._answer(name)

    def forget(self, names: Iterable[str]) -> None:
        """The owner of ``names`` is restarting: lookups wait for its new address."""
        for name in names:
            self.endpoints.pop(name, None)

    def _answer(self, name: str) -> Outgoing:
        address = self.endpoints.get(name)
        if address is None:
            return []
        return [(w, LookupResult(name, address)) for w in self._waiting.pop(name, [])]
