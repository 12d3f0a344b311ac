"""The config check for data-parallel trainers (``PolicyConfig.trainer_workers`` above 1).

Several trainers of one policy average their gradients through the policy's model, so they need a
trainer to run and a policy that can wrap its model for that: ``distributed_setup()``, which every
``algorithm.policy.SingleModelPytorchPolicy`` has. Scripted policies and other policies fail here,
before any process starts, rather than in a trainer process.
"""

from __future__ import annotations

from typing import Any

from api.errors import RegistryError
from api.registry import REGISTRIES


def check_data_parallel(path: str, pc: Any) -> list[str]:
    """What stops the policy at ``path`` (an ``api.config.PolicyConfig``, which imports this
    module) from training with ``pc.trainer_workers`` trainers."""
    n = pc.trainer_workers
    if not isinstance(n, int) or n <= 1:  # a wrong type is the type check's to report
        return []
    if not pc.trainer.type:
        return [f"{path}.trainer_workers: {n} trainers for a policy without a trainer; set it to 1"]
    try:
        cls = REGISTRIES["policy"].spec(pc.policy.type).load()
    except RegistryError:
        return []  # the policy's own check reports it
    if isinstance(cls, type) and not callable(getattr(cls, "distributed_setup", None)):
        return [
            f"{path}.trainer_workers: {n} trainers train data-parallel, which needs a policy with "
            f"distributed_setup() (a subclass of algorithm.policy.SingleModelPytorchPolicy); "
            f"'{pc.policy.type}' ({cls.__module__}.{cls.__qualname__}) has none: set "
            "trainer_workers=1"
        ]
    return []
