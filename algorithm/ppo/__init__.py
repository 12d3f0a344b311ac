"""Proximal Policy Optimization."""
