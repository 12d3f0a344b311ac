"""SAC: soft actor-critic for Box actions, from replayed transitions."""
