"""Command-line arguments that several ``troupe`` commands take alike."""

from __future__ import annotations

import argparse

IMPORT_HELP = (
    "your own .py file or module, imported here and in every worker before anything is built "
    "(it registers your environments, policies, ...); repeatable"
)


def add_import_argument(parser: argparse.ArgumentParser, help_text: str = IMPORT_HELP) -> None:
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help=help_text,
    )


def at_least_one(text: str) -> int:
    """A whole number of at least 1 (``--episodes 0`` ended in a numpy traceback; ``troupe
    test-env --steps -5`` passed, having stepped nothing)."""
    return _whole(text, 1)


def at_least_zero(text: str) -> int:
    """A whole number of at least 0 (a seed)."""
    return _whole(text, 0)


def _whole(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value
