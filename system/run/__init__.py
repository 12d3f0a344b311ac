"""Running a whole experiment: the controller, the worker process main, serial mode, reports."""
