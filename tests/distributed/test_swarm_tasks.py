"""How a Swarm run's worker tasks ended, from task records shaped as the Docker API returns them
(tests/docker/test_swarm.py kills a real task's container and reads the same lines)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from distributed.deploy.swarm import controller_exit_code
from distributed.deploy.swarm_tasks import TaskWatch, last_failure, task_end
from distributed.launch.signals import EXIT_FAILED, EXIT_INTERRUPTED
from system.run.launch_end import LAUNCH_ID_ENV


def task(
    state: str,
    *,
    code: int | None = None,
    err: str = "",
    slot: int | None = None,
    service: str = "svc-actor",
    updated: str = "2026-12-03T12:00:00Z",
    ident: str = "t1",
    created: str = "2026-12-03T11:00:00Z",
) -> dict:
    status: dict = {"State": state, "Message": state, "Err": err}
    if code is not None:
        status["ContainerStatus"] = {"ExitCode": code}
    record = {"ID": ident, "ServiceID": service, "Status": status, "UpdatedAt": updated,
              "CreatedAt": created}  # fmt: skip
    if slot is not None:
        record["Slot"] = slot
    return record


def test_a_failed_task_says_its_exit_and_a_rejected_one_swarms_reason():
    assert task_end(task("failed", code=137, err="task: non-zero exit (137)")) == (
        "exit code 137 (SIGKILL; out of memory? see docker events, or dmesg)"
    )
    assert task_end(task("failed", code=3)) == "exit code 3"
    assert task_end(task("rejected", err="No such image: troupe-worker:gone")) == (
        "rejected by Swarm: No such image: troupe-worker:gone"
    )
    assert task_end(task("failed", err="starting container failed")) == (
        "failed: starting container failed"
    )
    # its container went in the engine's restart: "exit code 0" said nothing
    assert task_end(task("failed", code=0, err="No such container: troupe-r-params.1.x")) == (
        "failed: No such container: troupe-r-params.1.x"
    )


def test_what_the_run_ends_itself_says_nothing():
    """Workers leave on the stop with exit 0 (complete); removed services shut tasks down."""
    for state in ("running", "complete", "shutdown", "pending"):
        assert task_end(task(state, code=0)) is None


def test_ps_names_the_replica_of_the_most_recent_failure():
    tasks = [
        task("failed", code=1, slot=2, updated="2026-12-03T12:00:01Z"),
        task("failed", code=137, slot=1, updated="2026-12-03T12:00:09Z"),
        task("running", slot=1),
    ]
    assert last_failure(tasks, "actor/{ordinal}").startswith("actor/0: exit code 137 (SIGKILL")
    assert last_failure([task("failed", code=1)], "params") == "exit code 1"
    assert last_failure([task("running")], "params") is None


def test_the_watch_reports_each_failed_task_once_and_a_controllers_restart():
    """A controller's failure, seen while the run goes on, is one Swarm starts again."""
    tasks = [
        task("failed", code=137, slot=2, service="svc-actor", ident="a", updated="1"),
        task("failed", code=137, service="svc-controller", ident="c", updated="2"),
        task("complete", code=0, service="svc-params", ident="p"),
    ]
    asked = []

    def answer(filters):
        asked.append(filters)
        return list(tasks)

    client = SimpleNamespace(api=SimpleNamespace(tasks=answer))
    services = [SimpleNamespace(id=i) for i in ("svc-actor", "svc-controller", "svc-params")]
    workers = {"svc-actor": "actor/{ordinal}", "svc-controller": "controller",
               "svc-params": "params"}  # fmt: skip
    watch = TaskWatch(client, services, lambda s: workers[s.id])
    sigkill = "exit code 137 (SIGKILL; out of memory? see docker events, or dmesg)"
    assert watch.poll() == [
        f"[actor/1] its task ended: {sigkill}",
        f"[controller] its task ended: {sigkill}; Swarm starts it again, to resume the run "
        "unless it had ended",
    ]
    assert watch.poll() == []  # said once
    tasks.append(task("failed", code=2, service="svc-params", ident="p2"))
    assert watch.poll() == ["[params] its task ended: exit code 2"]
    assert asked[0] == {"service": ["svc-actor", "svc-controller", "svc-params"]}  # one call


def test_the_watch_stays_quiet_when_the_engine_cannot_answer():
    def fail(filters):
        raise ConnectionError("engine restarting")

    client = SimpleNamespace(api=SimpleNamespace(tasks=fail))
    watch = TaskWatch(client, [SimpleNamespace(id="s")], lambda s: "params")
    assert watch.poll() == []


def test_service_log_lines_name_the_replica_that_wrote_them():
    from distributed.ops.backends import _service_lines

    tasks = [task("running", slot=1, ident="a0"), task("running", slot=2, ident="a1")]

    def logs(**_):
        detail = "com.docker.swarm.node.id=n1,com.docker.swarm.task.id={} {}\n"
        return [detail.format(i, text).encode() for i, text in
                (("a1", "step 1"), ("a0", "step 2"), ("gone", "old line"))]  # fmt: skip

    service = SimpleNamespace(tasks=lambda: tasks, logs=logs)
    assert list(_service_lines("actor/{ordinal}", service, tail=10)) == [
        ("actor/1", "step 1"),
        ("actor/0", "step 2"),
        ("actor/?", "old line"),  # its task is no longer listed: no guessed ordinal
    ]
    assert next(_service_lines("controller", service, tail=10)) == ("controller", "step 1")


def controller_tasks(*tasks: dict, replicas: int = 1, launch: str = "l1") -> SimpleNamespace:
    """A client whose controller service lists ``tasks``, its tasks given launch id ``launch``."""
    spec = {
        "Mode": {"Replicated": {"Replicas": replicas}},
        "TaskTemplate": {"ContainerSpec": {"Env": ["A=1", f"{LAUNCH_ID_ENV}={launch}"]}},
    }
    service = SimpleNamespace(tasks=lambda: list(tasks), attrs={"Spec": spec})
    return SimpleNamespace(services=SimpleNamespace(get=lambda name: service))


def ended(seconds_ago: float, state: str = "failed", code: int = 137, **kw) -> dict:
    """A controller task that ended ``seconds_ago``."""
    record = task(state, code=code, **kw)
    at = datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)
    record["Status"]["Timestamp"] = at.isoformat()
    return record


def test_a_controller_that_swarm_is_to_start_again_has_not_ended_the_run(tmp_path):
    """Swarm starts a failed controller again (it resumes the run): `deploy --wait` and `troupe
    stop` took its first failure for the run's end, and exited while it resumed."""
    first = ended(2, ident="t1", created="2026-12-05T10:00:00Z")
    assert controller_exit_code(controller_tasks(first), "r") is None  # a restart is due
    # its restart is there: the run goes on
    again = task("starting", ident="t2", created="2026-12-05T10:00:03Z")
    assert controller_exit_code(controller_tasks(first, again), "r") is None
    # no restart comes: scaled to zero (troupe stop), long ago, or restarts spent
    assert controller_exit_code(controller_tasks(first, replicas=0), "r") == 137
    assert controller_exit_code(controller_tasks(ended(60)), "r") == 137
    spent = [ended(2, ident=f"t{i}", created=f"2026-12-05T10:00:0{i}Z") for i in range(3)]
    assert controller_exit_code(controller_tasks(*spent), "r") == 137
    # no task yet (just deployed), and none left: Swarm removes those of a service scaled to
    # zero (`troupe stop` waited for such a run's end until its own time ran out)
    assert controller_exit_code(controller_tasks(), "r") is None
    (tmp_path / "summary.json").write_text(json.dumps({"stop_reason": "interrupted"}))
    assert controller_exit_code(controller_tasks(replicas=0), "r", tmp_path) == EXIT_INTERRUPTED
    assert controller_exit_code(controller_tasks(replicas=0), "r") == EXIT_FAILED  # no folder
    # the newest task is the run's, whatever order Swarm lists them in
    done = ended(1, state="complete", code=0, ident="t3", created="2026-12-05T10:00:09Z")
    assert controller_exit_code(controller_tasks(done, first), "r") == 0


def test_a_controller_started_again_after_its_run_failed_exits_0_and_the_run_says_1(tmp_path):
    """A failed run's controller exits 1, Swarm starts it again, and that one, with nothing to
    resume, exits 0: the run's code is its summary's, not a false 0."""
    failed = ended(30, code=1, ident="t1", created="2026-12-05T10:00:00Z")
    nothing = ended(20, state="complete", code=0, ident="t2", created="2026-12-05T10:00:03Z")
    summary = {"stop_reason": "failed", "launch_id": "l1"}
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    client = controller_tasks(failed, nothing)
    assert controller_exit_code(client, "r", tmp_path) == EXIT_FAILED
    # another launch's summary (its controller wrote none): the task's own 0
    assert controller_exit_code(controller_tasks(failed, nothing, launch="l2"), "r", tmp_path) == 0


def test_a_controller_task_whose_container_went_in_an_engine_restart_exits_as_its_run_ended(
    tmp_path,
):
    """Swarm records such a task failed with exit code 0 ("No such container"): `deploy --wait`
    exited 0 for a run whose summary said it was interrupted."""
    gone = task("failed", code=0, err="No such container: troupe-r-controller.1.mox6g")
    (tmp_path / "summary.json").write_text(json.dumps({"stop_reason": "interrupted"}))
    assert controller_exit_code(controller_tasks(gone), "r", tmp_path) == EXIT_INTERRUPTED
    (tmp_path / "summary.json").unlink()  # killed before it could write one
    assert controller_exit_code(controller_tasks(gone), "r", tmp_path) == EXIT_FAILED
    assert controller_exit_code(controller_tasks(gone), "r") == EXIT_FAILED  # no folder here
    assert controller_exit_code(controller_tasks(task("complete", code=0)), "r") == 0
    assert controller_exit_code(controller_tasks(task("failed", code=130)), "r") == 130
    assert controller_exit_code(controller_tasks(task("running")), "r") is None


def test_the_controllers_own_exit_codes_say_how_its_run_ended():
    """The controller's exit code is its run's (130: stopped in order, 1: failed), not a death
    by a signal: `troupe ps` said "last failed: exit code 130 (SIGINT)" of a controller that an
    engine's restart had sent SIGTERM, and that had stopped its run in order."""
    stopped = task("failed", code=130, err="task: non-zero exit (130)")
    assert task_end(stopped, "controller") == "exit code 130 (the run was stopped in order)"
    assert last_failure([stopped], "controller") == "exit code 130 (the run was stopped in order)"
    failed = task("failed", code=1)
    assert task_end(failed, "controller") == "exit code 1 (the run failed: summary.json says why)"
    killed = task("failed", code=137)
    assert task_end(killed, "controller").startswith("exit code 137 (SIGKILL")
    assert task_end(stopped, "params") == "exit code 130 (SIGINT)"  # a worker's is a signal's


def test_ps_says_ended_not_failed_of_a_controller(monkeypatch):
    from distributed.deploy import swarm
    from distributed.ops.backends import SwarmBackend
    from distributed.ops.record import LaunchRecord

    def service(name: str, worker: str, *tasks: dict) -> SimpleNamespace:
        spec = {"Mode": {"Replicated": {"Replicas": 1}}, "Labels": {}}
        return SimpleNamespace(name=name, worker=worker, tasks=lambda: list(tasks),
                               attrs={"Spec": spec})  # fmt: skip

    services = [
        service("troupe-r-controller", "controller", task("failed", code=130)),
        service("troupe-r-params", "params", task("complete", code=0)),
    ]
    monkeypatch.setattr(SwarmBackend, "_services", lambda self, record: (None, services))
    monkeypatch.setattr(swarm, "worker_of", lambda s: s.worker)
    rows = {p.name: p for p in SwarmBackend().processes(LaunchRecord("swarm", "r"))}
    assert rows["troupe-r-controller"].detail == (
        "restarts 0; ended: exit code 130 (the run was stopped in order)"
    )
    assert rows["troupe-r-params"].detail == "restarts 0"
    # killed, and started again by Swarm to resume the run: not the run's end
    services[0] = service("troupe-r-controller", "controller",
                          task("failed", code=137), task("running"))  # fmt: skip
    rows = {p.name: p for p in SwarmBackend().processes(LaunchRecord("swarm", "r"))}
    assert rows["troupe-r-controller"].detail.startswith("restarts 1; last ended: exit code 137")


def test_deploy_wait_follows_the_controllers_lines_again_when_the_stream_ends(monkeypatch):
    """An engine's restart ends the log stream ("context canceled") while Swarm starts the
    controller again to resume the run: its lines were never shown. The stream is followed
    again from the second of the last line, and a line of that second shows once."""
    from rich.console import Console

    from distributed.deploy import swarm

    streams = [
        [b"2026-12-05T21:36:00.100000000Z run starts", b"2026-12-05T21:36:01.5Z v1"],
        [b"Error grabbing logs: context canceled"],
        [b"2026-12-05T21:36:01.5Z v1", b"2026-12-05T21:36:30.25Z resumed from v1"],
    ]
    asked = []

    def logs(**kw):
        asked.append(kw["since"])
        if not streams:
            raise RuntimeError("404 Client Error: service not found")  # removed: the end
        return iter(streams.pop(0))

    monkeypatch.setattr(swarm, "RETRY_S", 0.0)
    console = Console(record=True, width=200)
    swarm._echo_logs(SimpleNamespace(logs=logs), console)
    assert console.export_text().splitlines() == [
        "run starts", "v1", "Error grabbing logs: context canceled", "resumed from v1"
    ]  # fmt: skip
    start = int(datetime(2026, 12, 5, 21, 36, tzinfo=timezone.utc).timestamp())
    assert asked == [None, start + 1, start + 1, start + 30]


def test_status_and_stop_see_a_run_whose_controller_swarm_starts_again_as_running(monkeypatch):
    """`troupe stop` waits for the run's end (``alive``): a controller task that failed a
    moment ago, which Swarm is to start again, is not the end (the stop went on to remove the
    services under the controller resuming the run)."""
    from distributed.ops.backends import SwarmBackend
    from distributed.ops.record import LaunchRecord

    def backend(*tasks: dict) -> SwarmBackend:
        client = controller_tasks(*tasks)
        service = client.services.get("troupe-r-controller")
        service.name = "troupe-r-controller"
        monkeypatch.setattr(SwarmBackend, "_services", lambda self, record: (client, [service]))
        return SwarmBackend()

    record = LaunchRecord("swarm", "r")
    assert backend(ended(2)).alive(record) is True  # to be started again
    assert backend(ended(60)).alive(record) is False  # restarts spent, or none came
    assert backend(ended(2, state="complete", code=0)).alive(record) is False
