"""The algorithms an environment id can be trained with: ``--algo`` and ``algo=``.

``troupe train ENV --algo ALGO`` (and ``show-config``, ``test-pipeline``, ``troupe.train``,
``troupe.test_pipeline``) runs the registered experiment named ALGO with ``env=ENV``: the
algorithm set up from the environment's spaces.
"""

from __future__ import annotations

from typing import Any

from api import registry
from api.errors import UserError

ALGORITHMS = ("auto", "ppo", "impala", "dqn", "sac", "mappo")
"""What ``--algo`` (``troupe train``, ``show-config``, ``test-pipeline``) and ``algo=``
(``troupe.train``, ``troupe.test_pipeline``) take: each the registered experiment of that name,
which takes ``env=`` (``legacy.experiments.auto``, ``legacy.experiments.by_algo``)."""


def on_environment(
    environment: Any, algo: str, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[str, list[str]]:
    """``troupe train ENV --algo ALGO`` as what :func:`api.resolve.load_experiment` takes: the
    experiment named ``algo`` and the overrides, ``env=ENV`` first (so that an override of the
    user's may follow it). The name of an experiment, which has its algorithm, is refused: read
    as an environment it failed with "unknown environment 'cartpole-ppo'"."""
    if algo not in ALGORITHMS:
        raise UserError(f"algo {algo!r}: one of {', '.join(ALGORITHMS)}")
    if environment is None:
        raise UserError(f"algo={algo} sets an algorithm up on an environment: name its id")
    if not isinstance(environment, str):
        raise UserError(
            f"algo={algo} sets an algorithm up on an environment id; got "
            f"{type(environment).__name__}, which has its own: drop algo"
        )
    if environment in registry.experiments and environment not in registry.environments:
        raise UserError(
            f"'{environment}' is an experiment, with its own algorithm: `troupe run "
            f"{environment}` (troupe.train('{environment}')) runs it; `troupe train ENV`, "
            "--algo and algo= take an environment id"
        )
    return algo, [f"env={environment}", *overrides]
