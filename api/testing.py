"""The user's door to Troupe's checks: run them before a long experiment.

* :func:`test_environment` — does an environment keep the Environment contract?
* :func:`test_pipeline` — do environment, policy and trainer work together (one process, the
  runtime's own workers)?

Both raise a :class:`~api.errors.UserError` subclass whose message names the problem and the fix.
Use them from your own tests through the module (``from api import testing``), or import the
names: both are marked ``__test__ = False`` so pytest does not collect them.
"""

from api.env_check import EnvironmentReport, test_environment
from api.pipeline_check import PipelineReport, test_pipeline

__all__ = ["EnvironmentReport", "PipelineReport", "test_environment", "test_pipeline"]
