"""Operating runs: ``troupe status|logs|stop|ps`` for every launcher."""
