"""The parameter client interface on a store in this process: serial mode's parameter service.

Parameters still pass through the wire codec on the way in and out, so a policy sees exactly
what it would see over a socket (the same types, and its own copies).
"""

from __future__ import annotations

from typing import Any

from system.parameters.interfaces import ParameterClientBase
from system.parameters.protocol import DEFAULT_TIMEOUT_S
from system.parameters.store import LATEST, ParameterStore, check_policy_name
from system.streams import wire


class InprocParameterService(ParameterClientBase):
    """The client interface on a :class:`ParameterStore` in this process, no sockets.

    Give each worker its own instance over one shared store: what ``poll_latest`` has handed
    out is tracked per instance.
    """

    def __init__(self, store: ParameterStore | None = None):
        super().__init__()
        self.store = store if store is not None else ParameterStore()

    def publish(
        self, policy, version, params, *, persist=False, trainer_state=None,
        timeout_s=DEFAULT_TIMEOUT_S,
    ):  # fmt: skip
        state = None if trainer_state is None else _through_wire(trainer_state)
        self.store.publish(
            policy, version, _through_wire(params), persist=persist, trainer_state=state
        )

    def trainer_state(self, policy, *, timeout_s=DEFAULT_TIMEOUT_S):
        saved = self.store.trainer_state(policy)
        return None if saved is None else (saved[0], _through_wire(saved[1]))

    def get(self, policy, version=LATEST, *, timeout_s=DEFAULT_TIMEOUT_S):
        number, params = self.store.get(policy, version)
        if version == LATEST:
            self._hand_out(policy, number)
        return number, _through_wire(params)

    def tag(self, policy, version, tag, *, timeout_s=DEFAULT_TIMEOUT_S):
        self.store.tag(policy, version, tag)

    def poll_latest(self, policy: str, *, timeout_s: float = 0.0) -> tuple[int, Any] | None:
        check_policy_name(policy)
        if self.store.wait_newer(policy, self._returned.get(policy), timeout_s) is None:
            return None
        number, params = self.store.get(policy, LATEST)
        self._hand_out(policy, number)
        return number, _through_wire(params)


def _through_wire(params: Any) -> Any:
    return wire.decode(wire.encode("params", params), copy=True).body
