"""Which worker containers a ``--launcher docker`` run starts again itself
(distributed/launch/docker_keeper.py), from inspections shaped as the engine returns them;
tests/docker stops and kills real containers."""

from __future__ import annotations

import io

import pytest

from distributed.launch.docker_keeper import Keeper, docker_gave_up, to_start_again
from distributed.launch.docker_output import LogPrinter
from system.run.worker_record import MAX_RESTARTS

STARTED, FINISHED = "2026-12-05T02:50:04.123456789Z", "2026-12-05T02:50:34.5Z"


def inspection(code=137, *, running=False, restarting=False, policy="on-failure", count=0,
               started=STARTED, finished=FINISHED):  # fmt: skip
    return {
        "State": {
            "Running": running, "Restarting": restarting, "ExitCode": code,
            "StartedAt": started, "FinishedAt": finished,
        },
        "RestartCount": count,
        "HostConfig": {"RestartPolicy": {"Name": policy, "MaximumRetryCount": MAX_RESTARTS}},
    }  # fmt: skip


def test_a_container_stopped_or_killed_by_hand_is_started_again():
    assert to_start_again(inspection(137))  # docker kill
    assert to_start_again(inspection(143))  # docker stop, after the worker's stop
    # Docker gave up on it long ago, but this process ran an hour: not a crash loop
    hour = inspection(1, count=MAX_RESTARTS, finished="2026-12-05T03:50:04Z")
    assert to_start_again(hour)


@pytest.mark.parametrize(
    "attrs",
    [
        inspection(0),  # left on its controller's stop
        inspection(1, restarting=True),  # Docker restarts it itself
        inspection(137, running=True),  # already back
        inspection(137, policy="no"),  # a role that is not restarted (the controller's)
        inspection(1, count=MAX_RESTARTS),  # Docker spent its restarts on a crash loop
        {**inspection(137), "State": {**inspection(137)["State"], "Status": "removing"}},
    ],
)
def test_what_docker_restarts_itself_or_should_not_restart_is_left(attrs):
    assert not to_start_again(attrs)


def test_docker_has_not_given_up_while_it_makes_its_last_restart():
    # at its last restart the count is already the most the policy allows
    assert not docker_gave_up(inspection(1, count=MAX_RESTARTS, restarting=True))
    assert not docker_gave_up(inspection(1, count=MAX_RESTARTS, running=True))
    assert docker_gave_up(inspection(1, count=MAX_RESTARTS))


def test_unreadable_times_count_as_a_short_run():
    assert docker_gave_up(inspection(1, count=MAX_RESTARTS, started="?", finished=None))
    assert not docker_gave_up(inspection(1, count=MAX_RESTARTS - 1))


class Container:
    def __init__(self, attrs):
        self.attrs, self.started = attrs, 0

    def start(self):
        self.started += 1


class Client:
    """The engine's containers, by id (only what the keeper calls)."""

    def __init__(self, **containers):
        self.containers = self
        self.by_id = containers

    def get(self, container_id):
        return self.by_id[container_id]


def test_a_removed_container_is_made_again_until_the_clean_up():
    out, made = io.StringIO(), []
    keeper = Keeper(Client(), LogPrinter(out), lambda worker: made.append(worker))
    keeper.on_event("destroy", "actor/1", "gone")
    assert made == ["actor/1"]
    assert out.getvalue() == (
        "[actor/1] its container was removed (docker rm): creating it again, as a cluster's "
        "scheduler would\n"
    )
    keeper.stop()  # the run's clean-up removes what it finds: nothing is made after it looked
    keeper.on_event("destroy", "actor/0", "gone")
    assert made == ["actor/1"]


def test_the_keeper_starts_again_until_the_run_stops_and_says_so():
    killed, crashed = Container(inspection(137)), Container(inspection(1, restarting=True))
    out = io.StringIO()
    keeper = Keeper(Client(a=killed, b=crashed, c=Container(inspection(137))), LogPrinter(out))
    keeper.on_event("die", "actor/0", "a")
    keeper.on_event("die", "actor/1", "b")
    assert (killed.started, crashed.started) == (1, 0)
    assert out.getvalue().startswith("[actor/0] Docker does not restart a container stopped by")
    looped = Container(inspection(1, count=MAX_RESTARTS))
    keeper.client.by_id["d"] = looped
    keeper.on_event("die", "policy/default/0", "d")
    assert looped.started == 0
    assert out.getvalue().splitlines()[-1] == (
        "[policy/default/0] Docker restarts it no more: 5 restarts, the last one running less "
        "than 60 s (a crash loop; see its lines above)"
    )
    keeper.on_event("die", "controller", "c")  # the run is over: what ends now is its end
    keeper.on_event("die", "actor/0", "a")
    assert killed.started == 1 and keeper.stopping.is_set()
