"""Replay: a buffer of trajectory segments that off-policy trainers (DQN, SAC) sample from.

Pure numpy data structures; the replay worker role (``system.workers.replay_worker``: actors ->
buffer -> trainer) wraps them. ``buffer.ReplayBuffer`` stores segments and samples n-step
transitions, uniformly or by priority (``sum_tree.SumTree``); ``rate_limiter.RateLimiter`` keeps
sampling and inserting in proportion.
"""
