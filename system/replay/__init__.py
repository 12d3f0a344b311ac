"""Replay: a buffer of trajectory segments that off-policy trainers (DQN, SAC) sample from.

Pure numpy data structures for now; a replay worker role (actors -> buffer -> trainer) will
wrap them. ``buffer.ReplayBuffer`` stores segments and samples n-step transitions, uniformly or by
priority (``sum_tree.SumTree``); ``rate_limiter.RateLimiter`` keeps sampling and inserting in
proportion.
"""
