"""``import troupe``: the Python API in one place (it lives in :mod:`distributed.api`).

The project's top-level folders are its architecture (``api``, ``algorithm``, ``legacy``,
``system``, ``distributed``); this one only gives users the short name they expect::

    import troupe
    result = troupe.train("cartpole-ppo")
    policy = troupe.load_policy(result.run_dir)
    troupe.test_pipeline("Corridor-v0")  # env, policy and trainer in this process, briefly
"""

from api.config import ExperimentConfig
from api.environment import register as register_environment
from api.policy import register as register_policy
from api.registry import register_callback, register_experiment, register_trainer
from api.testing import test_environment, test_pipeline
from distributed.api import LoadedPolicy, RunResult, evaluate, load_policy, train

__all__ = [
    "ExperimentConfig",
    "LoadedPolicy",
    "RunResult",
    "evaluate",
    "load_policy",
    "register_callback",
    "register_environment",
    "register_experiment",
    "register_policy",
    "register_trainer",
    "test_environment",
    "test_pipeline",
    "train",
]
