"""``troupe deploy k8s --apply``: the generated objects created through the Kubernetes API.

The objects are made in file order (namespace, config, claim, controller, then the workers) by
the official Python client, from the current kubeconfig context or in-cluster configuration; the
first refusal stops it, named (an existing run of the same name, no create rights, an API that
does not answer). ``troupe status|logs|stop`` reach a run through the same :func:`connect`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from distributed.errors import ApplyError, KubernetesClientError

# kind -> (API class of the kubernetes client, its create method, namespaced?)
CREATORS: dict[str, tuple[str, str, bool]] = {
    "Namespace": ("CoreV1Api", "create_namespace", False),
    "ConfigMap": ("CoreV1Api", "create_namespaced_config_map", True),
    "Secret": ("CoreV1Api", "create_namespaced_secret", True),
    "PersistentVolumeClaim": ("CoreV1Api", "create_namespaced_persistent_volume_claim", True),
    "Service": ("CoreV1Api", "create_namespaced_service", True),
    "Pod": ("CoreV1Api", "create_namespaced_pod", True),
    "Job": ("BatchV1Api", "create_namespaced_job", True),
    "PodDisruptionBudget": ("PolicyV1Api", "create_namespaced_pod_disruption_budget", True),
    "NetworkPolicy": ("NetworkingV1Api", "create_namespaced_network_policy", True),
}


def connect() -> dict[str, Any]:
    """The API objects :func:`apply_objects` needs, from the kubeconfig (or in-cluster)."""
    try:
        import kubernetes
    except ImportError as e:
        raise KubernetesClientError(
            "--apply needs the kubernetes Python client: pip install kubernetes (or leave out "
            "--apply and run kubectl apply -k on the output directory)"
        ) from e
    try:
        kubernetes.config.load_kube_config()
    except Exception as e:  # ConfigException, or a broken file; try in-cluster before giving up
        try:
            kubernetes.config.load_incluster_config()
        except Exception:
            raise KubernetesClientError(
                f"no usable kubeconfig ({e}): set KUBECONFIG or write ~/.kube/config, check it "
                "with kubectl get ns, or leave out --apply and use kubectl apply -k"
            ) from e
    client = kubernetes.client
    apis = ("CoreV1Api", "BatchV1Api", "PolicyV1Api", "NetworkingV1Api")
    return {name: getattr(client, name)() for name in apis}


def apply_objects(objects: Sequence[dict], apis: Mapping[str, Any]) -> list[str]:
    """Create each object in order; an existing namespace is fine, any other conflict is not
    (a second run of the same name would mix its workers with the first's)."""
    done = []
    for obj in objects:
        kind, meta = obj["kind"], obj["metadata"]
        if kind not in CREATORS:
            raise ApplyError(f"cannot create a {kind}: add it to k8s_apply.CREATORS")
        api_name, method, namespaced = CREATORS[kind]
        create = getattr(apis[api_name], method)
        try:
            if namespaced:
                create(namespace=meta["namespace"], body=obj)
            else:
                create(body=obj)
        except Exception as e:
            status = getattr(e, "status", None)
            if status == 409 and kind == "Namespace":
                done.append(f"namespace {meta['name']} exists already")
                continue
            raise _apply_error(kind, meta, status, e) from e
        done.append(f"created {kind} {meta['name']}")
    return done


def _apply_error(kind: str, meta: dict, status: int | None, e: Exception) -> ApplyError:
    where = f"{kind} {meta['name']}"
    if status == 409:
        return ApplyError(
            f"{where} exists already: pick another --run-name, or remove the old run first "
            f"(kubectl delete -n {meta.get('namespace')} all,cm,secret,pvc -l "
            f"troupe.run={meta['labels'].get('troupe.run')})"
        )
    if status == 403:
        return ApplyError(f"{where}: forbidden ({getattr(e, 'reason', e)}); ask for create rights")
    if status is not None:
        return ApplyError(f"{where}: the API answered {status} {getattr(e, 'reason', '')}: {e}")
    return ApplyError(f"{where}: cannot reach the Kubernetes API ({e}); check kubectl get ns")
