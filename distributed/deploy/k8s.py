"""``troupe deploy k8s``: one experiment as Kubernetes objects, written as files (``--apply``
creates them: :mod:`.k8s_apply`).

One object per file in ``DIR/base``, numbered in the order they are created, with a
``kustomization.yaml``, and a site overlay over it (:mod:`.k8s_overlay`), so ``kubectl apply -k
DIR`` and ``kubectl delete -k DIR`` handle the run as a whole. The objects:

- a Namespace (unless ``--no-namespace-object``), a ConfigMap with ``config.json``, a Secret with
  the run's CURVE keys (made here, per run; the file is owner-only), a ReadWriteMany PVC for the
  run folder (``--storage claim``, unless ``--existing-claim``), or with ``--storage pod`` one
  ReadWriteOnce PVC per pod that writes (see below);
- the controller: a headless Service (stable DNS for the workers) and a Job whose init container
  copies ``config.json`` into the run folder; the Job's end is the run's end;
- one Indexed Job per role group of the controller's plan: ``params``, ``replay-<policy>`` (an
  off-policy policy's replay buffer), ``trainer-<policy>``, ``policy-<policy>``, ``actor``,
  ``eval``. Index N runs worker ``<group>/N`` (``TROUPE_ORDINAL`` comes from the pod's
  completion-index annotation). The parameter service also gets a headless Service that is its
  pods' ``subdomain``, so ``<run>-params-0.<run>-params`` resolves.

Why Jobs and not StatefulSets: at the end of a run the controller stops every worker and they
exit 0. A StatefulSet restarts them, and the restarted workers, unable to reach the finished
controller, crash-loop while holding their CPUs and GPUs. In a Job with ``restartPolicy:
OnFailure`` an exit 0 completes the index and nothing restarts it; a crashed or killed worker
exits non-zero and the kubelet restarts it in place (same pod, same IP), and it says hello to the
controller again. Finished Jobs are deleted ``ttlSecondsAfterFinished`` later.

Every pod that writes the run folder (controller, params, trainers, replay buffers, which save
their buffer there when the run stops) mounts the claim at the same path, because workers write to
the path the controller hands them.

``--storage pod``, for clusters with no ReadWriteMany storage: each pod that writes mounts a
ReadWriteOnce claim of its own at that path, named after the run and the pod
(``RUN-controller-run``, ``RUN-params-0-run``, ``RUN-replay-<policy>-0-run``), so deploying the
same run again (a resume) finds them. Nothing needs to be shared: the controller writes the
config, metrics and summary, the parameter service the checkpoints (with each trainer's optimiser
state, which trainers ship to it instead of writing a file), a replay worker its buffer. Trainers
mount no volume.

Longer than 400 lines because one small function per Kubernetes object kind; splitting them would
scatter the one manifest set a reader wants to see whole.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.config import ExperimentConfig
from distributed.deploy.cluster_commands import CONTROLLER_PORT, METRICS_PORT
from distributed.deploy.manifests import (
    CONTROLLER_RETRIES,
    HELPER_RESOURCES,
    Resources,
    RoleGroup,
    check_run_name,
    config_json,
    role_groups,
    to_yaml,
)
from distributed.deploy.sizing import (
    CONTROLLER,
    MEASURED,
    RoleNeeds,
    component_plan,
    components,
    needs_of,
)
from distributed.errors import DeployError
from distributed.images.build import DEFAULT_TAG
from distributed.launch.docker_run import STOP_GRACE_S
from system import run_folder
from system.run.worker_arguments import CONTROLLER_WAIT_S

MOUNT = "/troupe/run"
KEYS_DIR, CONFIG_DIR = "/troupe/keys", "/troupe/config"
UID = 10001  # the image's troupe user (docker/Dockerfile)
MAX_RUN_NAME = 40  # leaves room for "-trainer-<policy>" within a 52-character Job name
MAX_JOB_NAME = 52  # pod host names are "<job>-<index>", a DNS label of at most 63 characters
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
HEARTBEAT_FILE = "/tmp/troupe-heartbeat"
"""Touched by the worker loop with every heartbeat (``TROUPE_HEARTBEAT_FILE``); /tmp is an
emptyDir, the root file system is read-only."""
BASE_DIR = "base"
"""Where the generated objects go in the output folder (the overlays' base)."""
STORAGE_MODES = ("claim", "pod", "none")
CONTROLLER_ENDED_THE_RUN = {
    "action": "FailJob",
    "onExitCodes": {"containerName": "controller", "operator": "In", "values": [1, 2, 126, 127]},
}
"""A controller that ended the run itself is not started again: exit 1, the run failed (its
summary says why; it would fail again, and each retry would resume it); 2, a bad argument; 126
and 127, no ``troupe`` in the image. One killed (130 after SIGTERM, 137) or lost with its node is
retried, to resume the run, as a requeued Slurm job does."""
RESTARTS_PER_WORKER = 10
"""A worker Job fails (and its pods are ended) after 10 restarts per replica, counted over the
Job: crashes and kills are retried, a worker that can never start does not loop for ever."""


@dataclass
class K8sOptions:
    """Everything about the cluster that the experiment itself does not say."""

    run_name: str
    image: str = DEFAULT_TAG
    """Worker image; with ``registry`` its name is put under the registry."""
    registry: str | None = None
    """Registry host (and path) the nodes pull from, e.g. ``registry.example.com/rl``."""
    pull_secrets: tuple[str, ...] = ()
    """Names of existing ``kubernetes.io/dockerconfigjson`` Secrets for a private registry."""
    gpu_image: str | None = None
    """Image of GPU trainers (default: IMAGE with ``-gpu`` after its tag, as ``troupe image
    build --gpu`` names it)."""
    namespace: str = "troupe"
    namespace_object: bool = True
    storage: str = "claim"
    """``claim``: the run folder on a ReadWriteMany claim (new, or ``existing_claim``);
    ``pod``: each pod that writes has a ReadWriteOnce claim of its own (controller, parameter
    service, replay workers; trainers none), which outlives the pod;
    ``none``: no shared volume, each pod writes an emptyDir that goes with it."""
    storage_class: str | None = None
    storage_size: str = "10Gi"
    """The size of the claim (with ``pod``, of each claim)."""
    existing_claim: str | None = None
    keys_secret: str | None = None
    """An existing Secret holding the run's keys (key ``keys``); None: ``RUN-keys``."""
    trainer_gpus: int | None = None
    """GPUs per trainer pod; ``None``: 1 when the policy asks for ``device=cuda...``, else 0."""
    resources: dict[str, Resources] = field(default_factory=dict)
    """Per component (``controller``, ``params``, ``trainer``...): requests and limits; what is
    not here comes from ``needs``."""
    needs: dict[str, RoleNeeds] = field(default_factory=lambda: dict(MEASURED))
    """Measured CPU and memory per component (``deploy/sizing.py``)."""
    image_pull_policy: str = "IfNotPresent"
    node_selectors: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per component, or ``*`` for every pod: node labels a pod must land on."""
    priority_class: str | None = None
    disruption_budget: bool = True
    """A PodDisruptionBudget keeping voluntary evictions (drains) off the controller,
    parameter service and trainers, whose loss stops or sets back the run."""
    network_policy: bool = False
    """A NetworkPolicy: the run's pods take traffic only from each other."""
    probe_stale_seconds: int = 60
    """A worker whose heartbeat file is older than this is restarted (liveness probe)."""
    finished_ttl_seconds: int | None = 86400
    """Worker Jobs are deleted this long after they finish (their logs go with them); ``None``
    keeps them. The controller Job is kept: its log holds the run's summary."""

    @property
    def claim(self) -> str:
        return self.existing_claim or f"{self.run_name}-run"

    @property
    def secret_name(self) -> str:
        return self.keys_secret or f"{self.run_name}-keys"

    @property
    def worker_image(self) -> str:
        return f"{self.registry.rstrip('/')}/{self.image}" if self.registry else self.image

    def check(self) -> K8sOptions:
        """Every problem with the options at once."""
        errors = []
        if self.storage not in STORAGE_MODES:
            errors.append(f"--storage {self.storage}: use claim, pod or none")
        if self.storage != "claim" and self.existing_claim:
            errors.append("--existing-claim needs --storage claim")
        if self.storage == "none" and self.storage_class:
            errors.append("--storage-class needs --storage claim or pod (none makes no claim)")
        if self.image_pull_policy not in ("Always", "IfNotPresent", "Never"):
            errors.append(
                f"--image-pull-policy {self.image_pull_policy}: Always, IfNotPresent or Never"
            )
        if self.probe_stale_seconds < 5:
            errors.append("--probe-stale-seconds must be at least 5")
        if errors:
            raise DeployError("cannot write the manifests:\n  - " + "\n  - ".join(errors))
        return self

    @property
    def run_dir(self) -> str:
        return f"{MOUNT}/{self.run_name}"


# --------------------------------------------------------------------- building
def build_manifests(
    config: ExperimentConfig, options: K8sOptions, keys_text: str | None = None
) -> list[dict[str, Any]]:
    """Every object of the run, in the order to create them (controller before workers: a
    worker waits only a minute for the controller's answer before it exits and is restarted).
    The keys' Secret is among them only when ``keys_text`` is given (``--apply``)."""
    check_run_name(options.run_name, MAX_RUN_NAME)
    options.check()
    groups = role_groups(config)
    b = _Builder(options)
    objects: list[dict[str, Any]] = []
    if options.namespace_object:
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": options.namespace, "labels": b.labels("namespace")},
            }
        )
    objects.append(b.config_map(config_json(config)))
    if keys_text is not None:  # only for --apply: created from memory, never written to a file
        objects.append(b.secret(keys_text))
    if options.storage == "claim" and options.existing_claim is None:
        objects.append(b.claim())
    if options.storage == "pod":
        objects += [b.claim(name, "ReadWriteOnce", policy) for name, policy in b.pod_claims(groups)]
    objects += [
        b.service(b.controller_host, b.select("controller"), ports=True),
        b.controller_job(),
    ]
    for group in groups:
        if group.component == "params":  # the subdomain of its pods: stable per-pod DNS
            objects.append(b.service(b.workload_name(group), b.select("params")))
        objects.append(b.worker_job(group, _gpus(config, group, options)))
    if options.disruption_budget:
        objects.append(b.disruption_budget(groups))
    if options.network_policy:
        objects.append(b.network_policy())
    return objects


def _gpus(config: ExperimentConfig, group: RoleGroup, options: K8sOptions) -> int:
    if group.component != "trainer":
        return 0
    if options.trainer_gpus is not None:
        return options.trainer_gpus
    device = str(config.policies[group.policy].policy.args.get("device", "cpu"))
    return 1 if device.startswith("cuda") else 0


def gpu_image(image: str) -> str:
    """``troupe-worker:latest`` -> ``troupe-worker:latest-gpu`` (``troupe image build --gpu``)."""
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:  # no tag ("registry:5000/troupe-worker" has a port, not a tag)
        return f"{image}:latest-gpu"
    return f"{name}:{tag}-gpu"


def runtime_components() -> tuple[str, ...]:
    """Pods whose eviction stops or sets back the run (the disruption budget's): the
    controller's, and those of every role whose plan says so (``WorkerPlan.holds_run_state``)."""
    held = [c for c in components() if (plan := component_plan(c)) and plan.holds_run_state]
    return (CONTROLLER, *dict.fromkeys(held))


class _Builder:
    """Builds the objects of one run; holds the names and labels they share."""

    def __init__(self, options: K8sOptions):
        self.o = options
        self.controller_host = f"{options.run_name}-controller"

    def labels(self, component: str, policy: str | None = None) -> dict[str, str]:
        labels = {
            "app.kubernetes.io/name": "troupe",
            "app.kubernetes.io/instance": self.o.run_name,
            "app.kubernetes.io/component": component,
            "app.kubernetes.io/part-of": "troupe",
            "app.kubernetes.io/managed-by": "troupe-deploy",
            "troupe.run": self.o.run_name,
        }
        if policy is not None:
            labels["troupe.policy"] = policy
        return labels

    def select(self, component: str, policy: str | None = None) -> dict[str, str]:
        """The labels that pick one group's pods (a subset of :meth:`labels`)."""
        keys = ("app.kubernetes.io/instance", "app.kubernetes.io/component", "troupe.policy")
        return {k: v for k, v in self.labels(component, policy).items() if k in keys}

    def meta(self, name: str, component: str, policy: str | None = None) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.o.namespace,
            "labels": self.labels(component, policy),
        }

    def workload_name(self, group: RoleGroup) -> str:
        suffix = group.name.replace("/", "-")
        name = f"{self.o.run_name}-{suffix}"
        if len(name) > MAX_JOB_NAME or not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
            raise DeployError(
                f"'{name}' is not a usable Job name (at most {MAX_JOB_NAME} characters of "
                "a-z, 0-9 and '-'): use a shorter --run-name or rename policy "
                f"'{group.policy}' to lower-case letters, digits and '-'"
            )
        return name

    def config_map(self, text: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "immutable": True,
            "metadata": self.meta(f"{self.o.run_name}-config", "config"),
            "data": {run_folder.CONFIG: text},
        }

    def secret(self, keys_text: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "immutable": True,
            "metadata": self.meta(f"{self.o.run_name}-keys", "keys"),
            "stringData": {"keys": keys_text},
        }

    def claim(
        self, name: str | None = None, access: str = "ReadWriteMany", policy: str | None = None
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "accessModes": [access],
            "resources": {"requests": {"storage": self.o.storage_size}},
        }
        if self.o.storage_class:
            spec["storageClassName"] = self.o.storage_class
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": self.meta(name or self.o.claim, "run-folder", policy),
            "spec": spec,
        }

    def writes(self, component: str) -> bool:
        """Whether the component's pods mount the run folder: those that write there (each
        with a claim of its own with ``--storage pod``), and, where the folder is shared,
        those that only read it (``WorkerPlan.run_folder``)."""
        plan = component_plan(component)
        access = "" if plan is None else plan.run_folder
        return access == "write" or (access == "read" and self.o.storage != "pod")

    def pod_claim(self, host: str) -> str:
        """``--storage pod``: the claim of the pod whose host name is ``host``."""
        return f"{host}-run"

    def pod_claims(self, groups: list[RoleGroup]) -> list[tuple[str, str | None]]:
        """``--storage pod``: (claim, policy) of every pod that writes: one per worker, so a
        group that writes must have one replica (a Job's pods share one template)."""
        claims: list[tuple[str, str | None]] = [(self.pod_claim(self.controller_host), None)]
        for group in groups:
            if not self.writes(group.component):
                continue
            if group.replicas != 1:
                raise DeployError(
                    f"--storage pod: group '{group.name}' has {group.replicas} workers, and "
                    "each would need a claim of its own; use --storage claim"
                )
            claims.append((self.pod_claim(f"{self.workload_name(group)}-0"), group.policy))
        return claims

    def service(self, name: str, selector: dict[str, str], ports: bool = False) -> dict[str, Any]:
        """Headless, and publishing pods before they are ready: workers need the controller's
        address while it starts, and nothing here has a readiness probe to wait for."""
        spec: dict[str, Any] = {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
        }
        if ports:
            spec["ports"] = [
                {
                    "name": "control",
                    "port": CONTROLLER_PORT,
                    "targetPort": CONTROLLER_PORT,
                    "protocol": "TCP",
                }
            ]
        component = selector["app.kubernetes.io/component"]
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self.meta(name, component, selector.get("troupe.policy")),
            "spec": spec,
        }

    def controller_job(self) -> dict[str, Any]:
        args = [
            "controller",
            self.o.run_dir,
            "--bind",
            f"tcp://0.0.0.0:{CONTROLLER_PORT}",
            "--advertise-host",
            self.controller_host,
            "--no-display",
            "--restart-grace",
            str(self.restart_grace_s()),
            "--metrics-port",
            str(METRICS_PORT),
        ]
        container = self.container("controller", self.o.worker_image, args, writes_run=True)
        container["env"].append({"name": "TROUPE_RUN_NAME", "value": self.o.run_name})
        claim = self.pod_claim(self.controller_host)
        container["ports"] = [
            {"name": "control", "containerPort": CONTROLLER_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ]
        script = f'mkdir -p "$RUN_DIR" && cp "$CONFIG" "$RUN_DIR/{run_folder.CONFIG}"'
        copy = self.container(
            "copy-config",
            self.o.worker_image,
            command=["sh", "-c", script],
            writes_run=True,
            component="init",
        )
        copy["env"] += [
            {"name": "RUN_DIR", "value": self.o.run_dir},
            {"name": "CONFIG", "value": f"{CONFIG_DIR}/{run_folder.CONFIG}"},
        ]
        copy["volumeMounts"].append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
        pod = self.pod_spec(
            [container], writes_run=True, restart="Never", component="controller", claim=claim
        )
        pod["initContainers"] = [copy]
        # `troupe stop` suspends this Job: the kubelet sends SIGTERM and waits this long for the
        # orderly stop (the trainers' last checkpoints) before SIGKILL; its default is 30 s
        pod["terminationGracePeriodSeconds"] = int(STOP_GRACE_S)
        pod["volumes"].append(
            {"name": "config", "configMap": {"name": f"{self.o.run_name}-config"}}
        )
        # A controller pod lost with its node (the budget keeps drains off it) is started
        # again, up to twice: it resumes the run from the run folder (the last persisted
        # version; metrics go on), and the workers, whose connection closed, exit and are
        # restarted by their kubelets to say hello to it (as a requeued Slurm job does).
        template = self.template("controller", pod)
        template["metadata"]["annotations"] = {  # what Prometheus's pod discovery looks for
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics",
        }
        spec = {
            "backoffLimit": CONTROLLER_RETRIES,
            "podFailurePolicy": {"rules": [CONTROLLER_ENDED_THE_RUN]},
            "podReplacementPolicy": "Failed",  # never two controllers on one run folder
            "template": template,
        }
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": self.meta(self.controller_host, "controller"),
            "spec": spec,
        }

    def worker_job(self, group: RoleGroup, gpus: int) -> dict[str, Any]:
        """An Indexed Job: index N runs worker ``<group>/N``; a worker that exits 0 (stopped by
        the controller) completes its index, one that fails is restarted in place."""
        name = self.workload_name(group)
        args = [
            "worker",
            "--id",
            group.id_template,
            "--role",
            group.role,
            "--controller",
            f"tcp://{self.controller_host}:{CONTROLLER_PORT}",
            "--controller-wait",  # a controller pod slow to come spent each worker's restarts
            f"{CONTROLLER_WAIT_S:.0f}",
        ]
        writes = self.writes(group.component)
        image = self.o.worker_image
        if gpus:
            image = self.o.gpu_image or gpu_image(image)
        container = self.container(group.component, image, args, writes_run=writes, gpus=gpus)
        container["env"].append({"name": "TROUPE_HEARTBEAT_FILE", "value": HEARTBEAT_FILE})
        container.update(self.probes())
        # The Job controller injects JOB_COMPLETION_INDEX after the template's own variables,
        # where $(JOB_COMPLETION_INDEX) could not refer to it: read the annotation it comes from.
        container["env"].append(
            {"name": "TROUPE_ORDINAL", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}
        )
        claim = self.pod_claim(f"{name}-0")  # --storage pod: one replica (pod_claims)
        pod = self.pod_spec(
            [container],
            writes_run=writes,
            restart="OnFailure",
            component=group.component,
            claim=claim,
        )
        # Sent SIGTERM, a worker waits for the controller's stop (system.run.term_signal): a
        # whole run deleted at once stops in order, the parameter service last, in this time
        pod["terminationGracePeriodSeconds"] = int(STOP_GRACE_S)
        if group.component == "params":
            pod["subdomain"] = name  # the headless Service of that name: <name>-0.<name>
        if gpus:
            pod["tolerations"] = [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ]
        # parallelism = completions: every index runs at once; the controller, not start order,
        # wires them. backoffLimit, not backoffLimitPerIndex: the API server accepts the latter
        # only with restartPolicy Never, which would replace a crashed pod instead of restarting
        # its container. With OnFailure, container restarts count against backoffLimit.
        # podReplacementPolicy Failed: an evicted pod's replacement (same worker id) starts only
        # once the old pod is gone, so no worker id runs twice (ignored before Kubernetes 1.29).
        spec: dict[str, Any] = {
            "completionMode": "Indexed",
            "completions": group.replicas,
            "parallelism": group.replicas,
            "backoffLimit": RESTARTS_PER_WORKER * group.replicas,
            "podReplacementPolicy": "Failed",
            "template": self.template(group.component, pod, group.policy),
        }
        if self.o.finished_ttl_seconds is not None:
            spec["ttlSecondsAfterFinished"] = self.o.finished_ttl_seconds
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": self.meta(name, group.component, group.policy),
            "spec": spec,
        }

    def template(self, component: str, pod: dict, policy: str | None = None) -> dict[str, Any]:
        return {"metadata": {"labels": self.labels(component, policy)}, "spec": pod}

    def container(
        self,
        name: str,
        image: str,
        args: list[str] | None = None,
        *,
        writes_run: bool,
        command: list[str] | None = None,
        gpus: int = 0,
        component: str | None = None,
    ) -> dict[str, Any]:
        """One container; ``component`` picks its resources (default: its name)."""
        resources = self.resources(component or name)
        mounts = [
            {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ]
        if writes_run:
            mounts.append({"name": "run", "mountPath": MOUNT})
        # HOME=/tmp: the root filesystem is read-only, and matplotlib and torch keep caches there.
        env = [
            {"name": "TROUPE_CURVE_KEYS_FILE", "value": f"{KEYS_DIR}/keys"},
            {"name": "HOME", "value": "/tmp"},
        ]
        return {
            "name": name,
            "image": image,
            "imagePullPolicy": self.o.image_pull_policy,
            **({"command": command} if command else {"args": args or []}),
            "env": env,
            "resources": resources.to_k8s(gpus),
            "volumeMounts": mounts,
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"]},
            },
        }

    def resources(self, component: str) -> Resources:
        """Overrides first; else the component's measured needs; small fixed asks for helpers."""
        if component in self.o.resources:
            return self.o.resources[component]
        if component in HELPER_RESOURCES:
            return HELPER_RESOURCES[component]
        return Resources.from_needs(needs_of(self.o.needs, component))

    def probes(self) -> dict[str, Any]:
        """Exec probes on the age of the heartbeat file the worker loop touches: a worker that
        hangs (its loop stops) is restarted by the kubelet, one that is slow to start is not.
        Startup allows five minutes for importing torch and the controller's configuration."""
        limit = self.o.probe_stale_seconds
        check = f'test $(( $(date +%s) - $(stat -c %Y "$TROUPE_HEARTBEAT_FILE") )) -lt {limit}'
        probe = {"exec": {"command": ["sh", "-c", check]}, "timeoutSeconds": 5}
        period = max(5, limit // 3)  # a hung worker is restarted within about twice the limit
        return {
            "startupProbe": {**probe, "periodSeconds": 5, "failureThreshold": 60},
            "livenessProbe": {**probe, "periodSeconds": period, "failureThreshold": 3},
            "readinessProbe": {**probe, "periodSeconds": period, "failureThreshold": 1},
        }

    def restart_grace_s(self) -> int:
        """The controller's ``--restart-grace``: how long it waits for the kubelet to bring a
        lost worker back before it fails the run. A hung worker is restarted by its liveness
        probe (the limit, then up to three failed checks), and the new container has the startup
        probe's five minutes to import torch and be configured; the controller's default (60 s)
        could give up before the probe had even fired."""
        limit = self.o.probe_stale_seconds
        return limit + 3 * max(5, limit // 3) + 300

    def pod_spec(
        self,
        containers: list[dict],
        *,
        writes_run: bool,
        restart: str,
        component: str = "",
        claim: str | None = None,
    ) -> dict:
        """``claim``: with ``--storage pod``, the pod's own claim (if it writes)."""
        # 0o440 and fsGroup: the keys are readable by the troupe user only, never world-readable.
        volumes: list[dict[str, Any]] = [
            {
                "name": "keys",
                "secret": {"secretName": self.o.secret_name, "defaultMode": 0o440},
            },
            {"name": "tmp", "emptyDir": {}},
        ]
        if writes_run and self.o.storage == "claim":
            volumes.append({"name": "run", "persistentVolumeClaim": {"claimName": self.o.claim}})
        elif writes_run and self.o.storage == "pod":
            assert claim is not None, "--storage pod: a pod that writes has a claim of its own"
            volumes.append({"name": "run", "persistentVolumeClaim": {"claimName": claim}})
        elif writes_run:  # --storage none: the pod's own folder, gone with the pod
            volumes.append({"name": "run", "emptyDir": {}})
        extra: dict[str, Any] = {}
        selector = {
            **self.o.node_selectors.get("*", {}),
            **self.o.node_selectors.get(component, {}),
        }
        if selector:
            extra["nodeSelector"] = selector
        if self.o.priority_class:
            extra["priorityClassName"] = self.o.priority_class
        if self.o.pull_secrets:
            extra["imagePullSecrets"] = [{"name": n} for n in self.o.pull_secrets]
        return {
            **extra,
            "restartPolicy": restart,
            "automountServiceAccountToken": False,  # no pod talks to the Kubernetes API
            "enableServiceLinks": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": UID,
                "runAsGroup": UID,
                "fsGroup": UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": containers,
            "volumes": volumes,
        }

    def disruption_budget(self, groups: list[RoleGroup]) -> dict[str, Any]:
        """Job pods have no scale subresource, so only an absolute minAvailable is allowed."""
        runtime = runtime_components()
        count = 1 + sum(g.replicas for g in groups if g.component in runtime)
        selector = {
            "matchLabels": {"app.kubernetes.io/instance": self.o.run_name},
            "matchExpressions": [
                {
                    "key": "app.kubernetes.io/component",
                    "operator": "In",
                    "values": list(runtime),
                }
            ],
        }
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": self.meta(f"{self.o.run_name}-runtime", "disruption-budget"),
            "spec": {"minAvailable": count, "selector": selector},
        }

    def network_policy(self) -> dict[str, Any]:
        """The run's pods talk to each other and look names up (DNS); nothing else reaches
        them or is reached by them (the image needs no network beyond the run)."""
        run = {"podSelector": {"matchLabels": {"troupe.run": self.o.run_name}}}
        dns = {
            "to": [{"namespaceSelector": {}}],
            "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
        }
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": self.meta(f"{self.o.run_name}-run-only", "network-policy"),
            "spec": {
                **run,
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [
                    {"from": [run]},
                    # the controller's /metrics, for a Prometheus in any namespace
                    {
                        "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
                        "from": [{"namespaceSelector": {}}],
                    },
                ],
                "egress": [{"to": [run]}, dns],
            },
        }


def fetch_pod(options: K8sOptions, claim: str | None = None) -> dict[str, Any]:
    """A pod that mounts the run folder and idles, to copy results out with ``kubectl cp``
    once the run's workers are gone (not part of the kustomization). With ``--storage pod``
    it mounts ``claim`` (default: the controller's, which holds the metrics and summary)."""
    b = _Builder(options)
    container = b.container("fetch", options.worker_image, [], writes_run=True)
    container["command"] = ["sleep", "infinity"]
    own = b.pod_claim(b.controller_host)
    claim = claim or own
    pod = b.pod_spec([container], writes_run=True, restart="Never", claim=claim)
    name = f"{options.run_name}-fetch"
    if options.storage == "pod" and claim != own:  # r1-params-0-run -> r1-params-0-fetch
        name = f"{claim.removesuffix('-run')}-fetch"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": b.meta(name, "fetch"),
        "spec": pod,
    }


def fetch_pods(config: ExperimentConfig, options: K8sOptions) -> list[dict[str, Any]]:
    """Fetch pods (:func:`fetch_pod`): one for the run folder's claim; with ``--storage pod``
    one per claim (the controller's, the parameter service's with the checkpoints, each replay
    worker's); none without storage."""
    if options.storage == "claim":
        return [fetch_pod(options)]
    if options.storage == "pod":
        claims = _Builder(options).pod_claims(role_groups(config))
        return [fetch_pod(options, claim) for claim, _ in claims]
    return []


# --------------------------------------------------------------------- files
def write_manifests(objects: Sequence[dict], extras: Sequence[dict], out: Path) -> list[Path]:
    """The objects, one numbered file each, as a kustomization in ``out/base``; the site's
    overlay over it (:mod:`.k8s_overlay`); ``out/kustomization.yaml`` naming that overlay, so
    ``kubectl apply -k out`` applies the base with the site's values; ``extras/`` apart. A
    Secret is never written: keys stay out of the output folder (see :func:`secret_command`)."""
    from distributed.deploy.k8s_overlay import OVERLAY_DIR, write_overlay

    base = out / BASE_DIR
    base.mkdir(parents=True, exist_ok=True)
    files = []
    for obj in (o for o in objects if o["kind"] != "Secret"):
        path = base / f"{len(files):02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.write_text(to_yaml(obj))
        files.append(path)
    (base / "kustomization.yaml").write_text(to_yaml(_kustomization([p.name for p in files])))
    files.append(write_overlay(objects, out))
    (out / "kustomization.yaml").write_text(to_yaml(_kustomization([str(OVERLAY_DIR)])))
    for obj in extras:
        path = out / "extras" / f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(to_yaml(obj))
        files.append(path)
    return files


def _kustomization(resources: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": resources,
    }


def secret_command(options: K8sOptions, python: str) -> str:
    """The shell line that makes the run's keys and stores them as its Secret in one pipe: the
    keys touch no file and no terminal."""
    return (
        f"{python} -m distributed.deploy.keys | kubectl create secret generic "
        f"{options.secret_name} --namespace {options.namespace} --from-file=keys=/dev/stdin"
    )
