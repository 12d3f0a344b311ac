"""Troupe's user-facing contract: environments, policies, trainers, NamedArray, registry, config.

This package imports nothing else of Troupe's (``api.testing`` is the one door that drives the
runtime's own components, and it imports them lazily).
"""
