"""Registered example experiments (see ``examples``)."""
