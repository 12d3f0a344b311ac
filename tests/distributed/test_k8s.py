"""``troupe deploy k8s``: the manifests validate against Kubernetes' own schemas and say what a run
needs; ``--apply`` creates them in order through a fake API client (there is no cluster here).

The schemas come from ``kubernetes-validate``, which bundles the JSON schemas generated from each
Kubernetes release's OpenAPI document; the ``-strict`` variants forbid unknown fields, so a
misspelled key fails here rather than being silently dropped by the API server. What the schemas
cannot say (rules the API server checks in code) :func:`check_api_server_rules` checks.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions, latest_version
from rich.console import Console

from api.config import make_experiment
from distributed.deploy import k8s, k8s_apply
from distributed.deploy.commands import add_deploy_arguments, run_deploy, run_k8s
from distributed.deploy.manifests import RoleGroup, parse_resource_overrides, to_yaml
from distributed.errors import DeployError
from system.run.worker_arguments import resolve_worker_id

KEYS = "k" * 40 + " " + "s" * 40 + " " + "c" * 40 + " " + "x" * 40


def latest_minor_versions(versions: list[str], count: int) -> tuple[str, ...]:
    """The newest release of each of the ``count`` newest minor versions; ``all_versions()`` lists
    a version once per bundled schema folder (``-local`` and ``-local-strict``), so versions are
    folded by (major, minor)."""
    newest: dict[tuple[int, int], tuple[int, ...]] = {}
    for version in versions:
        parts = tuple(map(int, version.split(".")))
        newest[parts[:2]] = max(newest.get(parts[:2], parts), parts)
    return tuple(".".join(map(str, newest[minor])) for minor in sorted(newest)[-count:])


SCHEMA_VERSIONS = latest_minor_versions(all_versions(), 3)
"""The three latest Kubernetes minor versions kubernetes-validate knows."""


def manifests(experiment: str, *overrides: str, **options) -> list[dict]:
    config = make_experiment(experiment, list(overrides))
    opts = k8s.K8sOptions(run_name="r1", **options)
    return [*k8s.build_manifests(config, opts, KEYS), k8s.fetch_pod(opts)]


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def containers(obj: dict) -> list[dict]:
    spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def worker_jobs(objects: list[dict]) -> dict[str, dict]:
    return {n: j for n, j in by_kind(objects, "Job").items() if n != "r1-controller"}


def check_api_server_rules(obj: dict) -> None:
    """Job rules the API server enforces in code, beyond the JSON schemas (see the field
    descriptions in the schemas and pkg/apis/batch/validation)."""
    if obj["kind"] != "Job":
        return
    spec, pod = obj["spec"], obj["spec"]["template"]["spec"]
    assert pod["restartPolicy"] in ("OnFailure", "Never")  # Always is refused for Jobs
    assert "selector" not in spec and "manualSelector" not in spec  # the Job makes its own
    if spec.get("completionMode") == "Indexed":
        assert spec["completions"] >= 1 and 1 <= spec["parallelism"] <= 10**5
    else:
        assert "backoffLimitPerIndex" not in spec and "maxFailedIndexes" not in spec
    # "It can only be set when Job's completionMode=Indexed, and the Pod's restart policy is
    # Never": a schema-valid Job with OnFailure and backoffLimitPerIndex is refused.
    if "backoffLimitPerIndex" in spec:
        assert pod["restartPolicy"] == "Never"
    if "podFailurePolicy" in spec:
        assert pod["restartPolicy"] == "Never"
        names = {c["name"] for c in pod["containers"] + pod.get("initContainers", [])}
        for rule in spec["podFailurePolicy"]["rules"]:
            codes = rule.get("onExitCodes")
            if codes is None:
                continue
            assert codes.get("containerName", next(iter(names))) in names
            values = codes["values"]  # "must be ordered", unique; In may not hold 0
            assert values == sorted(set(values)) and not (codes["operator"] == "In" and 0 in values)
    if spec.get("podReplacementPolicy") == "TerminatingOrFailed":
        assert "podFailurePolicy" not in spec
    # pods are named <job>-<index>-<random>, their host name <job>-<index> is a DNS label
    hostname = f"{obj['metadata']['name']}-{spec.get('completions', 1) - 1}"
    assert len(hostname) <= 63 and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", hostname)


EVERY_OPTION = {
    "trainer_gpus": 1,
    "registry": "registry.example.com/rl",
    "pull_secrets": ("regcred",),
    "node_selectors": {"*": {"pool": "rl"}, "trainer": {"gpu": "a100"}},
    "priority_class": "batch-low",
    "disruption_budget": True,
    "network_policy": True,
}


def test_the_schemas_are_the_three_latest_minor_versions():
    minors = {tuple(v.split(".")[:2]) for v in SCHEMA_VERSIONS}
    assert len(minors) == 3 and SCHEMA_VERSIONS[-1] == latest_version()
    assert latest_minor_versions(["1.2.0", "1.3.1", "1.3.1", "1.3.0", "1.4.0", "1.4.0"], 2) == (
        "1.3.1",
        "1.4.0",
    )


@pytest.mark.parametrize("experiment", ["cartpole-ppo", "gather-2p-ppo", "cartpole-dqn"])
@pytest.mark.parametrize("storage", ["claim", "pod", "none"])
def test_every_object_validates_against_the_kubernetes_schemas(experiment, storage):
    options = {"storage_class": "standard"} if storage != "none" else {}
    objects = manifests(experiment, storage=storage, **options, **EVERY_OPTION)
    opts = k8s.K8sOptions(run_name="r1", storage=storage, **options, **EVERY_OPTION)
    for obj in objects + k8s.fetch_pods(make_experiment(experiment, []), opts):
        written = yaml.safe_load(to_yaml(obj))
        assert written == obj  # what the files hold is what was validated
        for version in SCHEMA_VERSIONS:
            kubernetes_validate.validate(written, version, strict=True)
        check_api_server_rules(written)


def test_the_api_server_rules_refuse_backoff_per_index_with_restarts_in_place():
    job = worker_jobs(manifests("cartpole-ppo"))["r1-actor"]
    job["spec"]["backoffLimitPerIndex"] = 10
    for version in SCHEMA_VERSIONS:  # the schemas of 1.28 (alpha) to now accept the field...
        kubernetes_validate.validate(job, version, strict=True)
    with pytest.raises(AssertionError):  # ...the API server does not, with OnFailure
        check_api_server_rules(job)


def test_the_schemas_are_strict_about_unknown_fields():
    job = by_kind(manifests("cartpole-ppo"), "Job")["r1-controller"]
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError, match="resource"):
        kubernetes_validate.validate(job, latest_version(), strict=True)


def test_two_policies_get_their_own_workloads_with_the_planned_ids():
    objects = manifests("gather-2p-ppo")
    jobs = worker_jobs(objects)
    expected = {
        "r1-params": (1, "params", "parameter_service"),
        "r1-trainer-red": (1, "trainer/red/{ordinal}", "trainer"),
        "r1-policy-red": (1, "policy/red/{ordinal}", "policy"),
        "r1-trainer-blue": (1, "trainer/blue/{ordinal}", "trainer"),
        "r1-policy-blue": (1, "policy/blue/{ordinal}", "policy"),
        "r1-actor": (2, "actor/{ordinal}", "actor"),
        "r1-eval": (1, "eval/{ordinal}", "actor"),
    }
    assert sorted(jobs) == sorted(expected)
    assert not [o for o in objects if o["kind"] in ("StatefulSet", "Deployment", "ReplicaSet")]
    for name, (replicas, worker_id, role) in expected.items():
        spec = jobs[name]["spec"]
        assert spec["completions"] == spec["parallelism"] == replicas
        args = spec["template"]["spec"]["containers"][0]["args"]
        assert args == [
            "worker",
            "--id",
            worker_id,
            "--role",
            role,
            "--controller",
            "tcp://r1-controller:5555",
            "--controller-wait",  # a controller pod slow to come must not spend their restarts
            "600",
        ]
    assert jobs["r1-trainer-red"]["metadata"]["labels"]["troupe.policy"] == "red"
    labels = jobs["r1-trainer-red"]["spec"]["template"]["metadata"]["labels"]
    assert labels["troupe.policy"] == "red" and labels["troupe.run"] == "r1"


@pytest.mark.parametrize("experiment", ["cartpole-dqn", "pendulum-sac"])
def test_an_off_policy_run_gets_a_replay_job_that_keeps_its_buffer_in_the_run_folder(experiment):
    objects = manifests(experiment, disruption_budget=True)
    jobs = worker_jobs(objects)
    assert sorted(jobs) == [
        "r1-actor", "r1-eval", "r1-params", "r1-policy-default", "r1-replay-default",
        "r1-trainer-default",
    ]  # fmt: skip
    replay = jobs["r1-replay-default"]
    assert replay["spec"]["completions"] == 1
    assert replay["metadata"]["labels"]["troupe.policy"] == "default"
    (c,) = replay["spec"]["template"]["spec"]["containers"]
    assert c["args"][:5] == ["worker", "--id", "replay/default", "--role", "replay"]
    # its estimate (64 MiB for 100k frames of small observations) plus 25 %, one busy core
    assert c["resources"] == {
        "requests": {"cpu": "1", "memory": "80Mi"},
        "limits": {"cpu": "1", "memory": "160Mi"},
    }
    assert "/troupe/run" in {m["mountPath"] for m in c["volumeMounts"]}  # replay.ckpt at a stop
    (budget,) = by_kind(objects, "PodDisruptionBudget").values()
    assert "replay" in budget["spec"]["selector"]["matchExpressions"][0]["values"]
    assert budget["spec"]["minAvailable"] == 4  # controller, params, trainer, replay
    bigger = manifests(experiment, resources=parse_resource_overrides(["replay=memory:2Gi"]))
    (c,) = worker_jobs(bigger)["r1-replay-default"]["spec"]["template"]["spec"]["containers"]
    assert c["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}


def test_workers_run_as_indexed_jobs_that_finish_when_the_controller_stops_them():
    objects = manifests("cartpole-ppo", "actors.workers=3")
    for name, job in worker_jobs(objects).items():
        spec, pod = job["spec"], job["spec"]["template"]["spec"]
        assert spec["completionMode"] == "Indexed", name
        # exit 0 (stopped by the controller) completes the index; a crash restarts in place
        assert pod["restartPolicy"] == "OnFailure", name
        assert spec["backoffLimit"] == 10 * spec["completions"], name
        assert "backoffLimitPerIndex" not in spec, name  # refused with OnFailure
        assert spec["podReplacementPolicy"] == "Failed", name  # one pod per worker id
        assert spec["ttlSecondsAfterFinished"] == 86400, name
        (c,) = pod["containers"]
        (ordinal,) = [e for e in c["env"] if e["name"] == "TROUPE_ORDINAL"]
        assert ordinal["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"
        )
    actor = worker_jobs(objects)["r1-actor"]
    assert actor["spec"]["completions"] == 3
    # index 2's pod: the annotation gives TROUPE_ORDINAL=2, its host name is r1-actor-2
    worker_id = actor["spec"]["template"]["spec"]["containers"][0]["args"][2]
    assert resolve_worker_id(worker_id, {"TROUPE_ORDINAL": "2"}, "r1-actor-2") == "actor/2"
    assert resolve_worker_id(worker_id, {}, "r1-actor-2") == "actor/2"
    # the controller stays a plain Job that is never retried and never deleted by a TTL
    controller = by_kind(objects, "Job")["r1-controller"]["spec"]
    assert "completionMode" not in controller and "ttlSecondsAfterFinished" not in controller
    kept = manifests("cartpole-ppo", finished_ttl_seconds=None)
    assert all("ttlSecondsAfterFinished" not in j["spec"] for j in worker_jobs(kept).values())


def test_the_controller_and_the_parameter_service_keep_stable_dns_names():
    objects = manifests("gather-2p-ppo")
    services = by_kind(objects, "Service")
    assert sorted(services) == ["r1-controller", "r1-params"]
    jobs = by_kind(objects, "Job")
    # pod r1-params-0-xxxxx has host name r1-params-0: r1-params-0.r1-params resolves
    subdomains = {n: j["spec"]["template"]["spec"].get("subdomain") for n, j in jobs.items()}
    assert {n: d for n, d in subdomains.items() if d} == {"r1-params": "r1-params"}
    for name, service in services.items():
        spec = service["spec"]
        assert spec["clusterIP"] == "None" and spec["publishNotReadyAddresses"] is True
        for job_name, job in jobs.items():  # a Service selects its own Job's pods only
            labels = job["spec"]["template"]["metadata"]["labels"]
            assert (spec["selector"].items() <= labels.items()) == (job_name == name)


def test_the_controller_job_copies_the_config_and_ends_the_run():
    objects = manifests("cartpole-ppo")
    job = by_kind(objects, "Job")["r1-controller"]
    pod = job["spec"]["template"]["spec"]
    # a controller lost with its node starts again and resumes the run from its folder
    assert job["spec"]["backoffLimit"] == 2 and pod["restartPolicy"] == "Never"
    (init,) = pod["initContainers"]
    assert init["command"][-1] == 'mkdir -p "$RUN_DIR" && cp "$CONFIG" "$RUN_DIR/config.json"'
    assert {"name": "RUN_DIR", "value": "/troupe/run/r1"} in init["env"]
    assert pod["containers"][0]["args"] == [
        "controller",
        "/troupe/run/r1",
        "--bind",
        "tcp://0.0.0.0:5555",
        "--advertise-host",
        "r1-controller",
        "--no-display",
        "--restart-grace",
        "420",  # 60 s stale, three checks 20 s apart, five minutes to start again
        "--metrics-port",
        "9400",
    ]
    service = by_kind(objects, "Service")["r1-controller"]["spec"]
    assert service["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert service["ports"][0]["port"] == 5555 and service["publishNotReadyAddresses"] is True


def test_a_controller_that_ended_the_run_is_not_started_again():
    """Only a controller lost or killed is retried. One that failed the run (exit 1) was run
    twice more, each resuming the failed run; and a pod being deleted was replaced while it was
    still stopping, two controllers on one run folder."""
    from distributed.launch.signals import EXIT_ABANDONED, EXIT_FAILED, EXIT_INTERRUPTED

    spec = by_kind(manifests("cartpole-ppo"), "Job")["r1-controller"]["spec"]
    (rule,) = spec["podFailurePolicy"]["rules"]
    codes = rule["onExitCodes"]
    assert rule["action"] == "FailJob" and codes["operator"] == "In"
    assert codes["containerName"] == "controller" and EXIT_FAILED in codes["values"]
    assert not {EXIT_INTERRUPTED, EXIT_ABANDONED, 137} & set(codes["values"])  # these resume
    assert spec["podReplacementPolicy"] == "Failed"


def test_the_controller_pod_gets_the_grace_period_of_an_orderly_stop():
    """`troupe stop` suspends the controller's Job; its pod then gets its own
    terminationGracePeriodSeconds (30 s if unset) between SIGTERM and SIGKILL, and the run's
    last checkpoints can take longer than that on a slow disk."""
    from distributed.launch.docker_run import STOP_GRACE_S

    jobs = by_kind(manifests("cartpole-ppo"), "Job")
    template = jobs["r1-controller"]["spec"]["template"]
    assert template["spec"]["terminationGracePeriodSeconds"] == STOP_GRACE_S
    # a run deleted whole: every worker waits for that stop, the parameter service stops last
    for name, job in jobs.items():
        assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == STOP_GRACE_S, (
            name
        )


def test_the_controller_is_scraped_where_prometheus_looks():
    """Pod annotations for Prometheus's pod discovery, a named port, and a network policy that
    lets a Prometheus of another namespace reach /metrics (and nothing else of the run)."""
    objects = manifests("cartpole-ppo")
    template = by_kind(objects, "Job")["r1-controller"]["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9400",
        "prometheus.io/path": "/metrics",
    }
    container = template["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9400} in container["ports"]
    assert {"name": "TROUPE_RUN_NAME", "value": "r1"} in container["env"]
    (policy,) = by_kind(manifests("cartpole-ppo", network_policy=True), "NetworkPolicy").values()
    scrape = [r for r in policy["spec"]["ingress"] if "ports" in r]
    assert scrape == [
        {"ports": [{"protocol": "TCP", "port": 9400}], "from": [{"namespaceSelector": {}}]}
    ]


def test_without_storage_writers_get_pod_folders_and_no_claim_is_made():
    objects = manifests("cartpole-ppo", storage="none")[:-1]  # the fetch pod needs a claim
    assert not by_kind(objects, "PersistentVolumeClaim")
    for name in ("r1-controller", "r1-params", "r1-trainer-default"):
        volumes = by_kind(objects, "Job")[name]["spec"]["template"]["spec"]["volumes"]
        assert {"name": "run", "emptyDir": {}} in volumes, name
    with pytest.raises(DeployError, match="--existing-claim needs --storage claim"):
        manifests("cartpole-ppo", storage="none", existing_claim="shared")


def test_with_pod_storage_each_writing_pod_mounts_a_claim_of_its_own():
    objects = manifests("cartpole-dqn", storage="pod", storage_class="ssd", storage_size="5Gi")
    claims = by_kind(objects, "PersistentVolumeClaim")
    own = {
        "r1-controller": "r1-controller-run",
        "r1-params": "r1-params-0-run",
        "r1-replay-default": "r1-replay-default-0-run",
    }
    assert sorted(claims) == sorted(own.values())  # no shared r1-run
    for claim in claims.values():
        assert claim["spec"] == {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "5Gi"}},
            "storageClassName": "ssd",
        }
    assert claims["r1-replay-default-0-run"]["metadata"]["labels"]["troupe.policy"] == "default"
    # claims come before the pods that mount them
    kinds = [o["kind"] for o in objects]
    assert max(i for i, k in enumerate(kinds) if k == "PersistentVolumeClaim") < kinds.index("Job")
    jobs = by_kind(objects, "Job")
    assert sorted(jobs) == sorted([*own, "r1-trainer-default", "r1-policy-default", "r1-actor",
                                   "r1-eval"])  # fmt: skip
    for name, job in jobs.items():
        pod = job["spec"]["template"]["spec"]
        mounted = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
                   if "persistentVolumeClaim" in v]  # fmt: skip
        run_volumes = [v for v in pod["volumes"] if v["name"] == "run"]
        assert mounted == ([own[name]] if name in own else []), name
        assert run_volumes or name not in own, name  # trainers: no volume at all
        for c in containers(job):
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert ("/troupe/run" in mounts) == (name in own), (name, c["name"])
    # deterministic: the same run deployed again (a resume) names the same claims
    again = manifests("cartpole-dqn", storage="pod", storage_class="ssd", storage_size="5Gi")
    assert sorted(by_kind(again, "PersistentVolumeClaim")) == sorted(claims)
    other = manifests("cartpole-dqn", storage="pod")
    assert "r1-params-0-run" in by_kind(other, "PersistentVolumeClaim")
    # a fetch pod per claim, to copy results out once the run is over
    opts = k8s.K8sOptions(run_name="r1", storage="pod")
    fetch = k8s.fetch_pods(make_experiment("cartpole-dqn", []), opts)
    assert {p["metadata"]["name"]: [v["persistentVolumeClaim"]["claimName"]
            for v in p["spec"]["volumes"] if "persistentVolumeClaim" in v] for p in fetch} == {
        "r1-fetch": ["r1-controller-run"],
        "r1-params-0-fetch": ["r1-params-0-run"],
        "r1-replay-default-0-fetch": ["r1-replay-default-0-run"],
    }  # fmt: skip


def test_storage_options_are_checked_together():
    for storage in ("pod", "none"):
        with pytest.raises(DeployError, match="--existing-claim needs --storage claim"):
            manifests("cartpole-ppo", storage=storage, existing_claim="shared")
    with pytest.raises(DeployError, match="--storage rwx: use claim, pod or none"):
        manifests("cartpole-ppo", storage="rwx")
    with pytest.raises(DeployError, match="--storage-class needs --storage claim or pod"):
        manifests("cartpole-ppo", storage="none", storage_class="ssd")
    b = k8s._Builder(k8s.K8sOptions(run_name="r1", storage="pod"))
    group = RoleGroup("replay/default", "replay", "replay/default/{n}", 2, "default")
    with pytest.raises(DeployError, match="'replay/default' has 2 workers"):
        b.pod_claims([group])


def test_writers_share_the_run_folder_and_every_pod_gets_keys_limits_and_non_root():
    objects = manifests("gather-2p-ppo")
    (claim,) = by_kind(objects, "PersistentVolumeClaim").values()
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    writers = {"r1-controller", "r1-params", "r1-trainer-red", "r1-trainer-blue", "r1-fetch"}
    for obj in objects:
        if obj["kind"] not in ("Job", "Pod"):
            continue
        name = obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["troupe.run"] == "r1"
        pod = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        claims = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert [v["persistentVolumeClaim"]["claimName"] for v in claims] == (
            ["r1-run"] if name in writers else []
        )
        for c in containers(obj):
            assert set(c["resources"]) == {"requests", "limits"}, name
            assert {"cpu", "memory"} <= set(c["resources"]["limits"]), name
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert ("/troupe/run" in mounts) == (name in writers), name
            env = {e["name"]: e.get("value") for e in c["env"]}
            assert env["TROUPE_CURVE_KEYS_FILE"] == "/troupe/keys/keys"


def test_gpu_trainers_get_gpu_limits_and_the_gpu_image():
    jobs = by_kind(manifests("gather-2p-ppo", trainer_gpus=2), "Job")
    for name, job in jobs.items():
        (c,) = job["spec"]["template"]["spec"]["containers"]
        gpus = c["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus == ("2" if "trainer" in name else None), name
        assert c["image"] == ("troupe-worker:latest-gpu" if gpus else "troupe-worker:latest")
    cuda = manifests("cartpole-ppo", "policies.default.policy.args.device=cuda")
    trainer = by_kind(cuda, "Job")["r1-trainer-default"]
    limits = trainer["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert k8s.gpu_image("registry:5000/troupe") == "registry:5000/troupe:latest-gpu"


def test_keys_are_only_in_the_secret():
    objects = manifests("cartpole-ppo")
    (config_map,) = by_kind(objects, "ConfigMap").values()
    (secret,) = by_kind(objects, "Secret").values()
    assert secret["stringData"] == {"keys": KEYS}
    assert yaml.safe_load(config_map["data"]["config.json"])["name"] == "cartpole-ppo"
    assert [o["kind"] for o in objects if KEYS in to_yaml(o)] == ["Secret"]
    config = make_experiment("cartpole-ppo", [])
    external = k8s.K8sOptions(run_name="r1", keys_secret="vault-troupe")
    without = k8s.build_manifests(config, external)  # no keys given: no Secret object
    assert not by_kind(without, "Secret")
    pod = by_kind(without, "Job")["r1-actor"]["spec"]["template"]["spec"]
    assert pod["volumes"][0]["secret"]["secretName"] == "vault-troupe"


def test_requests_and_limits_come_from_the_measured_figures():
    """Measured peaks (actor 53, trainer 323 MiB) plus 25 %, not 1-2 CPUs and GiBs each."""
    jobs = by_kind(manifests("cartpole-ppo"), "Job")

    def resources(name: str) -> dict:
        return jobs[name]["spec"]["template"]["spec"]["containers"][0]["resources"]

    assert resources("r1-actor") == {
        "requests": {"cpu": "1", "memory": "80Mi"},
        "limits": {"cpu": "1", "memory": "160Mi"},
    }
    assert resources("r1-trainer-default")["requests"] == {"cpu": "1", "memory": "416Mi"}
    assert resources("r1-params")["requests"] == {"cpu": "250m", "memory": "80Mi"}
    assert resources("r1-controller")["requests"] == {"cpu": "250m", "memory": "272Mi"}


def test_resource_overrides_and_their_errors():
    objects = manifests("cartpole-ppo", resources=parse_resource_overrides(["actor=cpu:3/4"]))
    (c,) = by_kind(objects, "Job")["r1-actor"]["spec"]["template"]["spec"]["containers"]
    assert c["resources"] == {
        "requests": {"cpu": "3", "memory": "80Mi"},
        "limits": {"cpu": "4", "memory": "160Mi"},
    }
    with pytest.raises(DeployError, match="request 2Gi exceeds limit 1Gi"):
        parse_resource_overrides(["trainer=memory:2Gi/1Gi"])
    with pytest.raises(DeployError, match="'4 cores' is not a quantity"):
        parse_resource_overrides(["trainer=cpu:4 cores"])


def test_workers_have_heartbeat_probes_and_the_probe_tells_fresh_from_stale(tmp_path):
    jobs = by_kind(manifests("cartpole-ppo", probe_stale_seconds=30), "Job")
    assert "livenessProbe" not in jobs["r1-controller"]["spec"]["template"]["spec"]["containers"][0]
    (actor,) = jobs["r1-actor"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in actor["env"]}
    assert env["TROUPE_HEARTBEAT_FILE"] == "/tmp/troupe-heartbeat"
    live = actor["livenessProbe"]
    assert (live["periodSeconds"], live["failureThreshold"]) == (10, 3)
    assert actor["startupProbe"]["periodSeconds"] * actor["startupProbe"]["failureThreshold"] == 300
    # the controller waits for the probe to restart a hung worker and for it to start again
    args = jobs["r1-controller"]["spec"]["template"]["spec"]["containers"][0]["args"]
    grace = int(args[args.index("--restart-grace") + 1])
    assert grace >= 30 + live["periodSeconds"] * live["failureThreshold"] + 300
    beat = tmp_path / "beat"
    beat.touch()

    def probe() -> int:
        environ = {"TROUPE_HEARTBEAT_FILE": str(beat), "PATH": "/usr/bin:/bin"}
        return subprocess.run(live["exec"]["command"], env=environ).returncode

    assert probe() == 0
    old = beat.stat().st_mtime - 31
    os.utime(beat, (old, old))
    assert probe() != 0
    beat.unlink()
    assert probe() != 0  # before the first heartbeat (the startup probe waits for it)


def test_bad_run_names_are_refused_with_the_fix():
    config = make_experiment("cartpole-ppo", [])
    with pytest.raises(DeployError, match="run name 'Run_1' must be at most 40 characters"):
        k8s.build_manifests(config, k8s.K8sOptions(run_name="Run_1"), KEYS)


def deploy(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_deploy_arguments(parser)
    return run_deploy(parser.parse_args(argv), Console(file=sys.stderr))


def test_the_command_writes_numbered_files_a_kustomization_and_no_keys(tmp_path, capsys):
    out = tmp_path / "m"
    assert (
        deploy(
            "k8s",
            "cartpole-ppo",
            "actors.workers=3",
            "--out",
            str(out),
            "--run-name",
            "cp",
            "--namespace",
            "rl",
        )
        == 0
    )
    kustomization = yaml.safe_load((out / "base" / "kustomization.yaml").read_text())
    names = kustomization["resources"]
    assert names[:3] == [
        "00-namespace-rl.yaml",
        "01-configmap-cp-config.yaml",
        "02-persistentvolumeclaim-cp-run.yaml",
    ]
    base = out / "base"
    assert sorted(p.name for p in base.glob("*.yaml")) == sorted([*names, "kustomization.yaml"])
    top = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert top["resources"] == ["overlays/site"]  # kubectl apply -k OUT: base + site values
    assert not [p for p in out.rglob("*") if "secret" in p.name or "keys" in p.name]
    assert names[3:7] == [
        "03-service-cp-controller.yaml",
        "04-job-cp-controller.yaml",
        "05-service-cp-params.yaml",
        "06-job-cp-params.yaml",
    ]
    actor = yaml.safe_load((base / "09-job-cp-actor.yaml").read_text())
    assert actor["spec"]["completions"] == 3 and actor["metadata"]["namespace"] == "rl"
    assert (out / "extras" / "pod-cp-fetch.yaml").exists()
    printed = " ".join(capsys.readouterr().err.split())
    command = (
        f"{sys.executable} -m distributed.deploy.keys | kubectl create secret generic cp-keys "
        "--namespace rl --from-file=keys=/dev/stdin"
    )
    assert command in printed
    # the printed pipe makes keys the controller and workers can load
    made = subprocess.run(
        [sys.executable, "-m", "distributed.deploy.keys"], capture_output=True, text=True
    )
    from system.streams.security import RunKeys

    assert RunKeys.from_text(made.stdout).to_text() == made.stdout


def test_the_command_with_pod_storage_writes_the_claims_and_a_fetch_pod_per_claim(tmp_path):
    out = tmp_path / "m"
    args = ["k8s", "cartpole-dqn", "--out", str(out), "--run-name", "dq", "--storage", "pod"]
    assert deploy(*args, "--storage-class", "local-path") == 0
    names = yaml.safe_load((out / "base" / "kustomization.yaml").read_text())["resources"]
    assert names[2:5] == [
        "02-persistentvolumeclaim-dq-controller-run.yaml",
        "03-persistentvolumeclaim-dq-params-0-run.yaml",
        "04-persistentvolumeclaim-dq-replay-default-0-run.yaml",
    ]
    assert sorted(p.name for p in (out / "extras").iterdir()) == [
        "pod-dq-fetch.yaml", "pod-dq-params-0-fetch.yaml", "pod-dq-replay-default-0-fetch.yaml"
    ]  # fmt: skip
    with pytest.raises(SystemExit):  # argparse refuses an unknown mode
        deploy("k8s", "cartpole-dqn", "--out", str(out), "--storage", "rwx")


def _without_empty(value):
    """An object with its empty lists and mappings left out (an overlay writes every knob, at
    an empty value where the base has none: the same pods)."""
    if isinstance(value, dict):
        return {k: _without_empty(v) for k, v in value.items() if v not in ([], {})}
    if isinstance(value, list):
        return [_without_empty(v) for v in value]
    return value


def _kustomize(path: Path) -> list[dict]:
    built = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True,
                           timeout=60)  # fmt: skip
    assert built.returncode == 0, built.stderr
    return [d for d in yaml.safe_load_all(built.stdout) if d]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_site_overlay_changes_what_a_site_changes_and_nothing_else(tmp_path):
    """Item 8 of issue 27: a Kustomize base with an overlay holding the site's values (image
    registry, pull secrets, node selectors, tolerations, resources, GPUs), generated from the
    same objects. Unchanged it gives the base; edited, the variant."""
    deploy("k8s", "cartpole-ppo", "--out", str(tmp_path), "--run-name", "s1", "--trainer-gpus", "1")
    base = _kustomize(tmp_path / "base")
    assert _without_empty(_kustomize(tmp_path)) == _without_empty(base)

    path = tmp_path / "overlays" / "site" / "kustomization.yaml"
    site = yaml.safe_load(path.read_text())
    site["images"] = [{"name": "troupe-worker", "newName": "registry.example.com/rl/troupe-worker"}]
    for patch in site["patches"]:
        ops = yaml.safe_load(patch["patch"])
        target = patch["target"].get("labelSelector", "")
        for op in ops:
            if op["path"].endswith("imagePullSecrets"):
                op["value"] = [{"name": "regcred"}]
            if target.endswith("=trainer") and op["path"].endswith("nodeSelector"):
                op["value"] = {"gpu": "a100"}
            if target.endswith("=trainer") and op["path"].endswith("resources"):
                op["value"]["limits"]["nvidia.com/gpu"] = "2"
            if target.endswith("=actor") and op["path"].endswith("tolerations"):
                op["value"] = [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}]
        patch["patch"] = yaml.safe_dump(ops)
    path.write_text(yaml.safe_dump(site))
    jobs = {o["metadata"]["labels"]["app.kubernetes.io/component"]: o["spec"]["template"]["spec"]
            for o in _kustomize(tmp_path) if o["kind"] == "Job"}  # fmt: skip
    assert all(j["imagePullSecrets"] == [{"name": "regcred"}] for j in jobs.values())
    assert all(c["image"].startswith("registry.example.com/rl/troupe-worker:")
               for j in jobs.values() for c in j["containers"])  # fmt: skip
    assert jobs["trainer"]["nodeSelector"] == {"gpu": "a100"}
    assert jobs["trainer"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert jobs["trainer"]["tolerations"][0]["key"] == "nvidia.com/gpu"  # the base's kept
    assert jobs["actor"]["tolerations"] == [
        {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert (
        jobs["params"]["containers"][0]["resources"]
        == next(o for o in base if o["metadata"]["name"] == "s1-params" and o["kind"] == "Job")[
            "spec"
        ]["template"]["spec"]["containers"][0]["resources"]
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_kustomize_reads_the_output(tmp_path):
    deploy("k8s", "gather-2p-ppo", "--out", str(tmp_path), "--run-name", "g")
    built = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    kinds = [d["kind"] for d in yaml.safe_load_all(built.stdout) if d]
    assert len(kinds) == 14 and kinds.count("Job") == 8 and kinds.count("Service") == 2
    assert kinds.count("PodDisruptionBudget") == 1  # on by default: a drain waits for the run


# --------------------------------------------------------------------- --apply
class ApiException(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(f"({status}) Reason: {reason}")
        self.status, self.reason = status, reason


class FakeApi:
    """Records every create call; answers 409 for the names in ``existing``."""

    def __init__(self, calls: list, existing: set[str] = frozenset()):
        self.calls, self.existing = calls, existing

    def __getattr__(self, method: str):
        def create(body: dict, namespace: str | None = None) -> dict:
            self.calls.append((method, namespace, body["metadata"]["name"]))
            if body["metadata"]["name"] in self.existing:
                raise ApiException(409, "AlreadyExists")
            return body

        return create


def fake_apis(calls: list, existing: set[str] = frozenset()) -> dict:
    apis = ("CoreV1Api", "BatchV1Api", "PolicyV1Api", "NetworkingV1Api")
    return {name: FakeApi(calls, existing) for name in apis}


def test_apply_creates_every_object_in_order_controller_before_workers(tmp_path):
    calls: list = []
    args = _args("k8s", "cartpole-ppo", "--out", str(tmp_path), "--run-name", "a", "--apply")
    assert run_k8s(args, Console(file=sys.stderr), connect_api=lambda: fake_apis(calls)) == 0
    assert calls[:8] == [
        ("create_namespace", None, "troupe"),
        ("create_namespaced_config_map", "troupe", "a-config"),
        ("create_namespaced_secret", "troupe", "a-keys"),
        ("create_namespaced_persistent_volume_claim", "troupe", "a-run"),
        ("create_namespaced_service", "troupe", "a-controller"),
        ("create_namespaced_job", "troupe", "a-controller"),
        ("create_namespaced_service", "troupe", "a-params"),
        ("create_namespaced_job", "troupe", "a-params"),
    ]
    assert [c[2] for c in calls if c[0] == "create_namespaced_job"] == [
        "a-controller",
        "a-params",
        "a-trainer-default",
        "a-policy-default",
        "a-actor",
        "a-eval",
    ]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_deploy_arguments(parser)
    return parser.parse_args(argv)


def test_apply_tolerates_an_existing_namespace_but_not_an_existing_run():
    objects = manifests("cartpole-ppo")[:-1]
    calls: list = []
    lines = k8s_apply.apply_objects(objects, fake_apis(calls, existing={"troupe"}))
    assert lines[0] == "namespace troupe exists already" and len(calls) == len(objects)
    with pytest.raises(
        k8s_apply.ApplyError, match="ConfigMap r1-config exists already: pick another"
    ):
        k8s_apply.apply_objects(objects, fake_apis([], existing={"troupe", "r1-config"}))


def test_apply_without_the_kubernetes_package_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    with pytest.raises(k8s_apply.KubernetesClientError, match="pip install kubernetes"):
        k8s_apply.connect()


def test_apply_without_a_kubeconfig_says_where_to_put_one(monkeypatch):
    def missing():
        raise FileNotFoundError("~/.kube/config")

    config = types.SimpleNamespace(load_kube_config=missing, load_incluster_config=missing)
    monkeypatch.setitem(sys.modules, "kubernetes", types.SimpleNamespace(config=config))
    with pytest.raises(
        k8s_apply.KubernetesClientError, match=re.escape("set KUBECONFIG or write ~/.kube/config")
    ):
        k8s_apply.connect()


def test_the_creators_name_real_kubernetes_client_methods():
    client = pytest.importorskip("kubernetes.client")
    for kind, (api, method, _) in k8s_apply.CREATORS.items():
        assert callable(getattr(getattr(client, api), method, None)), kind


# --------------------------------------------------------------------- the troupe command
@pytest.fixture
def troupe_with_deploy(monkeypatch):
    """``troupe`` with a ``deploy`` row in ``cli.SUBCOMMANDS`` (added here if missing)."""
    from distributed import cli
    from distributed.deploy import commands as deploy

    if any(row.name == "deploy" for row in cli.SUBCOMMANDS):
        return cli.main
    row = cli.Subcommand(
        "deploy",
        "generate a cluster deployment: troupe deploy swarm|k8s|slurm",
        deploy.add_deploy_arguments,
        deploy.run_deploy,
    )
    monkeypatch.setattr(cli, "SUBCOMMANDS", [*cli.SUBCOMMANDS, row])
    return cli.main


def test_troupe_deploy_k8s_through_the_command_line(troupe_with_deploy, tmp_path, capsys):
    assert troupe_with_deploy(["deploy", "k8s", "cartpole-ppo", "--out", str(tmp_path)]) == 0
    assert "then create the run with: kubectl apply -k" in capsys.readouterr().out
    code = troupe_with_deploy(
        ["deploy", "k8s", "cartpole-ppo", "--out", str(tmp_path), "--run-name", "x" * 41]
    )
    assert code == 1
    assert f"error: run name '{'x' * 41}' must be at most 40 characters" in capsys.readouterr().err


def test_deploy_swarm_explains_a_missing_swarm_module(troupe_with_deploy, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "distributed.deploy.swarm", None)
    assert troupe_with_deploy(["deploy", "swarm", "cartpole-ppo"]) == 1
    assert "troupe deploy swarm is not part of this installation" in capsys.readouterr().err
