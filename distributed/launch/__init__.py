"""Launchers: start a run's workers as local processes or Docker containers."""
