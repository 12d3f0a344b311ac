"""IMPALA: actor-critic with V-trace off-policy correction."""
