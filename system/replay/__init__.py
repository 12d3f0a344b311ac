"""Replay: a buffer of trajectory segments that off-policy trainers (DQN, SAC) sample from.

Pure numpy data structures for now; a replay worker role (actors -> buffer -> trainer) will
wrap them. :class:`ReplayBuffer` stores segments and samples n-step transitions, uniformly or by
priority (:class:`SumTree`); :class:`RateLimiter` keeps sampling and inserting in proportion.
"""

from system.replay.buffer import ReplayBuffer, ReplayConfig
from system.replay.rate_limiter import RateLimiter, RateLimiterConfig
from system.replay.sum_tree import SumTree

__all__ = ["RateLimiter", "RateLimiterConfig", "ReplayBuffer", "ReplayConfig", "SumTree"]
