"""Run-wide coordination: what every process of a run agrees on through the global state.

One module per feature, each with its driver (in the controller, deciding from the run's figures)
and its follower (in the workers, on their heartbeat):

- :mod:`.state`: the key/value state itself (the controller's store, each worker's replica);
- :mod:`.curriculum`: the stage (driver: a metric crossing thresholds; follower: an actor's
  environments);
- :mod:`.pbt`: population-based training (driver: exploit and explore orders; follower: a
  member's trainer), with its decision rules in :mod:`.pbt_rules`;
- :mod:`.ratings`: self-play ratings of the league's players (the opponent pool samples by them);
- :mod:`.evaluation_hold`: the version the judged policy's workers hold for evaluation
  (driver: :class:`system.run.stopping.EvaluationWindows`; follower: a policy worker);
- :mod:`.coordinator`: the controller's one object over the drivers, and a worker's followers.
"""
