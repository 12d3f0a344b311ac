"""A small kubelet under Docker: runs the pods of ``troupe deploy k8s``'s Jobs as containers.

No Kubernetes node can be started here (kind and k3s download binaries; neither is a PyPI or
Debian package), so the parts of the manifests that decide whether a run works are carried out
as a kubelet would, and nothing else: each Job index is a pod named ``<job>-<index>`` with that
host name, the Services' DNS names as network aliases (``RUN-controller``, and
``RUN-params-0.RUN-params`` from the pod's ``subdomain``), init containers first, then the
container's image, command/args and env (the completion index through the downward API), its
volume mounts (the Secret and ConfigMap as read-only folders, emptyDirs and the claim as folders
that outlive container restarts), its security context (user, read-only root file system, no
capabilities, no privilege escalation), its CPU and memory limits, restart policy, and its
startup and liveness exec probes: a container whose liveness probe fails ``failureThreshold``
times in a row is killed and started again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distributed.deploy.manifests import quantity

logger = logging.getLogger(__name__)
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


@dataclass
class Pod:
    name: str
    job: dict
    index: int
    container: Any = None
    started: bool = False
    """The startup probe has passed (liveness is checked only from then on)."""
    failures: int = 0
    next_probe: float = 0.0
    probe_restarts: int = 0
    exits: list[int] = field(default_factory=list)
    done: bool = False


@dataclass
class Kubelet:
    client: Any
    objects: list[dict]
    keys_text: str
    workdir: Path
    run: str
    pods: list[Pod] = field(default_factory=list)
    network: Any = None

    # ----------------------------------------------------------------- start
    def start(self) -> None:
        self.network = self.client.networks.create(f"troupe-kubelet-{self.run}-cluster")
        # A Secret's 0440 and the pod's fsGroup let only the troupe user read the keys (0444
        # here: a bind mount has no fsGroup); a ConfigMap's files are 0644 by default.
        folders = {"keys": ({"keys": self.keys_text}, 0o444)}
        for cm in (o for o in self.objects if o["kind"] == "ConfigMap"):
            folders[cm["metadata"]["name"]] = (cm["data"], 0o644)
        for name, (files, mode) in folders.items():
            folder = self.workdir / "volumes" / name
            folder.mkdir(parents=True)
            for file, text in files.items():
                (folder / file).write_text(text)
                (folder / file).chmod(mode)
        for claim in (o for o in self.objects if o["kind"] == "PersistentVolumeClaim"):
            folder = self.claim_dir(claim["metadata"]["name"])
            folder.mkdir(parents=True)
            folder.chmod(0o777)
        for job in (o for o in self.objects if o["kind"] == "Job"):
            for index in range(job["spec"].get("completions", 1)):
                name = job["metadata"]["name"] + (
                    f"-{index}" if "completionMode" in job["spec"] else ""
                )
                pod = Pod(name, job, index)
                self.pods.append(pod)
                for init in job["spec"]["template"]["spec"].get("initContainers", []):
                    init_container = self._create(pod, init)
                    init_container.start()
                    status = init_container.wait(timeout=120)["StatusCode"]
                    init_container.remove(force=True)
                    assert status == 0, f"init container of {name} exited {status}"
                pod.container = self._create(pod, job["spec"]["template"]["spec"]["containers"][0])
                pod.container.start()

    def _create(self, pod: Pod, spec: dict) -> Any:
        template = pod.job["spec"]["template"]["spec"]
        aliases = [pod.name]
        if "subdomain" in template:
            aliases.append(f"{pod.name}.{template['subdomain']}")
        component = pod.job["metadata"]["labels"]["app.kubernetes.io/component"]
        for service in (o for o in self.objects if o["kind"] == "Service"):
            if service["spec"]["selector"].get("app.kubernetes.io/component") == component:
                aliases.append(service["metadata"]["name"])
        env = {}
        for e in spec.get("env", []):
            ref = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
            env[e["name"]] = str(pod.index) if ref == COMPLETION_INDEX else e["value"]
        limits = spec["resources"]["limits"]
        context, security = template["securityContext"], spec["securityContext"]
        container = self.client.containers.create(
            spec["image"],
            command=spec.get("args"),
            entrypoint=spec.get("command"),
            name=f"troupe-kubelet-{self.run}-{pod.name}-{spec['name']}",
            hostname=pod.name,
            environment=env,
            user=f"{context['runAsUser']}:{context['runAsGroup']}",
            group_add=[str(context["fsGroup"])],
            read_only=security["readOnlyRootFilesystem"],
            cap_drop=security["capabilities"]["drop"],
            security_opt=["no-new-privileges"] if not security["allowPrivilegeEscalation"] else [],
            mem_limit=int(quantity(limits["memory"])),
            nano_cpus=int(quantity(limits["cpu"]) * 1e9),
            volumes=self._mounts(pod, spec, template),
            network=self.network.name,
            labels={"troupe.kubelet": self.run},
        )
        self.network.disconnect(container)  # reconnect with the pod's DNS names
        self.network.connect(container, aliases=aliases)
        return container

    def _mounts(self, pod: Pod, spec: dict, template: dict) -> dict[str, dict]:
        volumes = {v["name"]: v for v in template["volumes"]}
        mounts = {}
        for m in spec["volumeMounts"]:
            volume = volumes[m["name"]]
            if "secret" in volume:
                source = self.workdir / "volumes" / "keys"
            elif "configMap" in volume:
                source = self.workdir / "volumes" / volume["configMap"]["name"]
            elif "persistentVolumeClaim" in volume:
                source = self.claim_dir(volume["persistentVolumeClaim"]["claimName"])
            else:  # emptyDir: the pod's, kept across its container's restarts
                source = self.workdir / "pods" / pod.name / m["name"]
                source.mkdir(parents=True, exist_ok=True)
                source.chmod(0o1777)
            mode = "ro" if m.get("readOnly") else "rw"
            mounts[str(source)] = {"bind": m["mountPath"], "mode": mode}
        return mounts

    def claim_dir(self, claim: str) -> Path:
        """The folder standing in for the volume of PersistentVolumeClaim ``claim``: one each,
        kept across the pods' restarts, shared by every pod that mounts the claim."""
        return self.workdir / "claims" / claim

    # ----------------------------------------------------------------- run
    def pod(self, name: str) -> Pod:
        return next(p for p in self.pods if p.name == name)

    def tick(self) -> None:
        """One pass of the kubelet's loop: restart policy and probes."""
        now = time.monotonic()
        for pod in self.pods:
            if pod.done:
                continue
            pod.container.reload()
            spec = pod.job["spec"]["template"]["spec"]
            if pod.container.status == "exited":
                code = pod.container.attrs["State"]["ExitCode"]
                pod.exits.append(code)
                if code == 0 or spec["restartPolicy"] == "Never":
                    pod.done = True
                else:
                    self._restart(pod, f"exited {code}")
                continue
            container = spec["containers"][0]
            probe = container.get("startupProbe" if not pod.started else "livenessProbe")
            if probe is None or now < pod.next_probe:
                continue
            pod.next_probe = now + probe["periodSeconds"]
            ok = pod.container.exec_run(probe["exec"]["command"]).exit_code == 0
            if ok:
                pod.started, pod.failures = True, 0
                continue
            pod.failures += 1
            if pod.failures >= probe["failureThreshold"]:
                pod.probe_restarts += 1
                self._restart(pod, f"{'liveness' if pod.started else 'startup'} probe failed")

    def _restart(self, pod: Pod, why: str) -> None:
        logger.warning("kubelet: restarting %s (%s)", pod.name, why)
        if pod.container.status != "exited":
            pod.container.kill()  # SIGKILL, as after a probe's grace period
        pod.container.start()
        pod.started, pod.failures, pod.next_probe = False, 0, 0.0

    def controller_done(self) -> bool:
        return self.pod(f"{self.run}-controller").done

    def stop(self) -> None:
        for pod in self.pods:
            if pod.container is not None:
                pod.container.remove(force=True)
        if self.network is not None:
            self.network.remove()
