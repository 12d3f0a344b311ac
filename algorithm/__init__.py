"""Algorithms: policies (actor-critic, recurrent) and trainers (PPO), with shared modules."""
