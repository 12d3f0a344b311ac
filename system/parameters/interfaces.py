"""What workers program against: a parameter reader, publisher and subscriber.

As in Acme's variable source / variable client split, the side that produces parameters and the
side that consumes them are separate interfaces: a trainer publishes (and reads its own latest
version back when it resumes), a policy worker subscribes. Both run unchanged over a remote
service (:class:`~system.parameters.client.ParameterClient`) or a store in this process
(:class:`~system.parameters.inproc.InprocParameterService`).
"""

from __future__ import annotations

import abc
from typing import Any

from system.parameters.protocol import DEFAULT_TIMEOUT_S
from system.parameters.store import LATEST


class ParameterReader(abc.ABC):
    """Reads stored versions, and names ones to keep."""

    @abc.abstractmethod
    def get(
        self, policy: str, version: int | str = LATEST, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> tuple[int, Any]:
        """``(version, params)`` for a version number or a tag (``"latest"``, ``"eval"``)."""

    @abc.abstractmethod
    def tag(
        self, policy: str, version: int, tag: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        """Point ``tag`` at ``version`` of ``policy``: the service keeps a tagged version (and
        writes its file, in a run). A policy worker tags the version it holds for evaluation."""

    def close(self) -> None:
        """Release sockets, if any."""
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ParameterPublisher(ParameterReader):
    """What a trainer needs: publish versions, tag them, read its latest back on resume."""

    @abc.abstractmethod
    def publish(
        self,
        policy: str,
        version: int,
        params: Any,
        *,
        persist: bool = False,
        trainer_state: Any = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        """Store ``version`` of ``policy`` (newer than the latest) and push it to subscribers.

        ``trainer_state`` (with ``persist``): the trainer's own state at this version, as
        :func:`system.parameters.trainer_state.to_wire` gives it, saved beside the checkpoint."""

    def publish_nowait(
        self, policy: str, version: int, params: Any, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        """Send ``version`` of ``policy`` (not persisted) and return without waiting for the
        answer: the next call on this publisher takes it (or :meth:`settle`), and raises what
        :meth:`publish` would have raised. A trainer sending a version every few steps need
        not wait out each round trip, which on a busy machine includes the service's turn on
        a core. ``params`` may change as soon as this returns. By default: :meth:`publish`."""
        self.publish(policy, version, params, timeout_s=timeout_s)

    def settle(self) -> None:
        """Wait for the answer to a :meth:`publish_nowait` still outstanding, if one is."""
        return None

    @abc.abstractmethod
    def trainer_state(
        self, policy: str, *, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> tuple[int, Any] | None:
        """``(version, state)`` of the trainer's own state saved last (in the form it was
        published), or None when none was."""


class ParameterSubscriber(ParameterReader):
    """What a policy worker needs: the newest version it has not loaded yet."""

    def __init__(self) -> None:
        self._returned: dict[str, int] = {}  # newest version handed out per policy

    @abc.abstractmethod
    def poll_latest(self, policy: str, *, timeout_s: float = 0.0) -> tuple[int, Any] | None:
        """The newest version of ``policy`` not handed out yet, or None.

        Never returns a version <= one already returned (by this method or by ``get`` of
        ``"latest"``), so a policy worker never reloads an unchanged version. Waits up to
        ``timeout_s`` for one (default: does not block).
        """

    def _hand_out(self, policy: str, version: int) -> None:
        self._returned[policy] = max(version, self._returned.get(policy, -1))

    def _is_new(self, policy: str, version: int) -> bool:
        return version > self._returned.get(policy, -1)


class ParameterClientBase(ParameterPublisher, ParameterSubscriber):
    """Both sides at once: the full client a worker gets from its wiring."""
