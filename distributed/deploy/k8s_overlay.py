"""A Kustomize overlay over the manifests: a site's values without generating again.

``troupe deploy k8s --out DIR`` writes the run's objects as a kustomization (the base,
``DIR/base``) and this overlay, ``DIR/overlays/site/kustomization.yaml``, generated from the same
objects with every value a site changes written out at what the base holds: the image (registry,
name, tag or digest), pull secrets, node selectors and tolerations by component, each
component's CPU and memory, and the trainers' GPUs. ``DIR/kustomization.yaml`` names the
overlay, so ``kubectl apply -k DIR`` applies the base with the site's values (unchanged: the
base itself). Another cluster or namespace is another copy of the overlay folder.

Kustomize rather than a Helm chart: ``kubectl`` reads it with no other tool, the base stays the
plain objects the tests check against the API schemas, and an overlay is data, not a template.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

OVERLAY_DIR = Path("overlays") / "site"
COMPONENT_LABEL = "app.kubernetes.io/component"


def _pod_spec(obj: dict) -> dict | None:
    if obj["kind"] == "Job":
        return obj["spec"]["template"]["spec"]
    return None


def _components(objects: Sequence[dict]) -> dict[str, dict[str, Any]]:
    """Component -> its first Job's pod spec (every Job of a component is built alike)."""
    found: dict[str, dict[str, Any]] = {}
    for obj in objects:
        spec = _pod_spec(obj)
        component = obj["metadata"]["labels"].get(COMPONENT_LABEL)
        if spec is not None and component and component not in found:
            found[component] = spec
    return found


def _image_name(reference: str) -> tuple[str, str | None]:
    """(name, tag or digest) of an image reference as Kustomize's ``images`` matches it."""
    if "@" in reference:
        name, _, digest = reference.partition("@")
        return name, digest
    name, _, tag = reference.rpartition(":")
    if name and "/" not in tag:
        return name, tag
    return reference, None


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def overlay_text(objects: Sequence[dict]) -> str:
    """The overlay's kustomization, values at what ``objects`` hold."""
    components = _components(objects)
    images = sorted({c["image"] for spec in components.values() for c in spec["containers"]})
    lines = [
        "# A site's values for this run, applied over the generated manifests (../../base):",
        "#   kubectl kustomize .   shows the result;   kubectl apply -k .   creates it.",
        "# Every value is what the base holds: change what your cluster needs.",
        "apiVersion: kustomize.config.k8s.io/v1beta1",
        "kind: Kustomization",
        "resources:",
        "  - ../../base",
        "",
        "# The image: its registry and name (newName), and a tag (newTag) or digest (digest).",
        "images:",
    ]
    versions: dict[str, set[str]] = {}
    for reference in images:
        name, version = _image_name(reference)
        versions.setdefault(name, set()).update([version] if version else [])
    for name, found in sorted(versions.items()):
        lines += [f"  - name: {name}", f"    newName: {name}"]
        if len(found) == 1:  # a name under two tags (CPU and GPU images) keeps both
            (version,) = found
            key = "digest" if version.startswith("sha256:") else "newTag"
            lines.append(f'    {key}: "{version}"')
    lines += ["", "patches:"]
    pull_secrets = next(iter(components.values()), {}).get("imagePullSecrets", [])
    lines += _patch(
        "Every pod: pull secrets of a private registry, e.g. [{name: regcred}].",
        {"kind": "Job"},
        [("add", "/spec/template/spec/imagePullSecrets", pull_secrets)],
    )
    for component, spec in sorted(components.items()):
        container = spec["containers"][0]
        ops = [
            ("add", "/spec/template/spec/nodeSelector", spec.get("nodeSelector", {})),
            ("add", "/spec/template/spec/tolerations", spec.get("tolerations", [])),
            ("replace", "/spec/template/spec/containers/0/resources", container["resources"]),
        ]
        what = f"{component} pods: node selector, tolerations, CPU and memory"
        if component == "trainer":
            what += ' (GPUs: nvidia.com/gpu in limits, e.g. "1")'
        lines += _patch(
            what + ".", {"kind": "Job", "labelSelector": f"{COMPONENT_LABEL}={component}"}, ops
        )
    return "\n".join(lines) + "\n"


def _patch(comment: str, target: dict, ops: list[tuple[str, str, Any]]) -> list[str]:
    """One JSON 6902 patch of the objects ``target`` selects, its values inline as JSON."""
    body = "\n".join(
        f"      - op: {op}\n        path: {path}\n        value: {_json(value)}"
        for op, path, value in ops
    )
    return [
        f"  # {comment}",
        f"  - target: {_json(target)}",
        "    patch: |-",
        body,
    ]


def write_overlay(objects: Sequence[dict], out: Path) -> Path:
    """``out/overlays/site/kustomization.yaml``, over ``out/base`` (named ``../../base``)."""
    path = Path(out) / OVERLAY_DIR / "kustomization.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(overlay_text(objects))
    return path
