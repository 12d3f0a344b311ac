"""How a run is placed: launchers, images, keys and the ``troupe`` command line."""
