"""A data-parallel trainer leaves its group in the order gloo needs: the policy's DDP wrapper
(and the reducer that holds the process group) goes first, then ``destroy_process_group``.

Destroyed the other way round, the wrapper later drops the group's last reference and the
group's destructor joins gloo's threads from wherever the wrapper is freed; in one CI run that
join never returned (a test that tore down in that order hung in ``ProcessGroupGloo``'s
destructor). A trainer process must not hang on its way out after a stop, so its ``close()``
is checked here: a real one-rank group formed by :func:`form_group`, a real trainer worker that
joins it and trains a step, and a record of what is alive when the group is destroyed.
"""

from __future__ import annotations

import weakref

import pytest
import torch.distributed as dist
from test_bad_messages import SEGMENT, real_segments
from test_trainer_state import trainer_worker
from torch.nn.parallel import DistributedDataParallel

from api.config import make_experiment
from system.parameters.inproc import InprocParameterService
from system.parameters.store import ParameterStore
from system.run import builders
from system.workers.trainer_group import GroupTrainerWorker, form_group


class Names:
    """The rendezvous of one process: what rank 0 announces is what a lookup finds."""

    def __init__(self):
        self.names: dict[str, tuple[str, int]] = {}

    def announce(self, name: str, port: int) -> None:
        self.names[name] = ("127.0.0.1", port)

    def lookup(self, name: str) -> tuple[str, int]:
        return self.names[name]


@pytest.mark.timeout(300, method="thread")
def test_close_frees_the_ddp_wrapper_before_it_destroys_the_group(tmp_path, monkeypatch):
    config = make_experiment(
        "cartpole-ppo", [f"actors.segment_length={SEGMENT}", "actors.envs_per_worker=4"]
    )
    spaces = builders.probe_spaces(config)
    params = InprocParameterService(ParameterStore(tmp_path, durable=True))
    worker = trainer_worker(config, spaces, params, tmp_path, GroupTrainerWorker)
    worker.join(form_group("default", 0, 1, Names(), "trainer_group/default"))
    wrapper = weakref.ref(worker.trainer.policy.net)
    assert isinstance(wrapper(), DistributedDataParallel)
    for chunk in real_segments(config, spaces, 2):
        worker.hub.producer().post("default", chunk)
    for _ in range(200):  # a step through the wrapper: its reducer has run
        if worker.poll():
            break
    assert worker.steps == 1

    alive_at_destroy = []
    destroy = dist.destroy_process_group

    def recorded(*args, **kwargs):
        alive_at_destroy.append(wrapper() is not None)
        return destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", recorded)
    worker.close()
    assert alive_at_destroy == [False]
    assert not dist.is_initialized()
    # the policy goes on, unwrapped, for whatever its process still does with it
    assert worker.trainer.policy.net is worker.trainer.policy.module
