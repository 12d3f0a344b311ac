"""The runtime: everything that runs inside a worker process."""
