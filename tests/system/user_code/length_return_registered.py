"""Registers ``length-return`` when imported: what ``troupe run --import`` loads in every
process of the run in tests/system/test_unbiased_evaluation.py (a test process that imports
``length_return`` itself registers nothing, so its configs carry no stray registration)."""

from length_return import LengthReturnEnv

from api.registry import register_environment

register_environment("length-return", LengthReturnEnv, override=True)
