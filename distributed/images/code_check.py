"""Whether a worker image can import a run's user code, checked before a deployment makes anything.

``troupe deploy swarm --import my_envs.py Corridor-v0`` with an image built without ``troupe image
build --add my_envs.py`` deployed every service. Its controller then failed with "cannot import
'my_envs.py' ... add it to the worker image" three times over (Swarm started it again each
time), and its workers looked for it. A container of the image now imports the run's code as each
worker would (:func:`api.code.load_code`, then every registration's entry point) before anything
is deployed, and the deploy is refused with the worker's own message. ``deploy k8s`` checks the
same where this machine's engine holds the image (a kind or minikube node's, a build host).

It then builds the run's environment once, as each actor would: ``troupe deploy k8s pong-ppo``
with an image built without the ``atari`` extra deployed every pod, and the run ended at once
on "Atari-v0 needs ale-py". A package missing from the image is refused as a missing file is;
any other failure to build there (a licence, a display) is only warned of: the actors may have
what this container has not.

The check runs ``python -m distributed.images.code_check`` in the image, with no network. An image
whose Troupe predates this module cannot answer: that is said, and the deploy goes on (one that
predates the environment check checks the code alone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
from typing import Any

from api.code import CodeConfig, load_code
from api.config.schema import from_mapping
from api.errors import UserError

logger = logging.getLogger(__name__)

CANNOT_IMPORT = 3
"""This module's exit code where the image cannot import the code (any other: it could not tell)."""
CANNOT_BUILD = 4
"""Its exit code where the environment failed to build for another reason (warned of)."""
MISSING_PACKAGE = 5
"""Its exit code where the environment failed to build for a package the image lacks."""
CHECK_TIMEOUT_S = 120.0
"""Longer than any import of user code should take; the container is removed either way."""


def needs_check(code: CodeConfig) -> bool:
    """Whether the run has code of the user's own (a run of Troupe's own components has none)."""
    return bool(code.imports or code.registrations)


def check_image_imports(
    client: Any, image: str, code: CodeConfig, named: str = "", environment: Any = None
) -> None:
    """Raise :class:`~api.errors.UserError` if a container of ``image`` (an image this engine
    holds) cannot import ``code`` as the run's workers will, or lacks a package ``environment``
    (the run's :class:`~api.config.ComponentConfig`) needs to build; warn where it cannot
    tell. ``named``: the image as the user named it (``image`` may be its pinned reference)."""
    import docker

    if not needs_check(code) and environment is None:
        return
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:  # in a registry only: pulled here, it would be checked
        logger.info("image %s is not on this engine: the run's code is not checked in it", image)
        return
    named = named or image
    logger.info("checking that image %s imports the run's code and builds its environment, as "
                "its workers will", named)  # fmt: skip
    try:
        code_of, said = _run_check(client, image, code, environment)
    except Exception as e:  # the engine failed, or the import hung: the workers will tell
        logger.warning("could not check that image %s imports the run's code (%s)", named, e)
        return
    if code_of == CANNOT_IMPORT:
        raise UserError(f"image {named} cannot import the run's code, as each worker would: {said}")
    if code_of == MISSING_PACKAGE:
        raise UserError(
            f"image {named} cannot build the run's environment '{environment.type}', as each "
            f"actor would: {said}"
        )
    if code_of == CANNOT_BUILD:
        last = said.splitlines()[-1] if said else "no output"
        logger.warning(
            "image %s could not build the run's environment here (%s); its actors will try",
            named,
            last,
        )
    elif code_of != 0:
        logger.warning(
            "could not check that image %s imports the run's code (exit code %d: %s); an image "
            "built before this check cannot answer it",
            named,
            code_of,
            said.splitlines()[-1] if said else "no output",
        )


def _run_check(client: Any, image: str, code: CodeConfig, environment: Any) -> tuple[int, str]:
    """This module's exit code and output in a container of ``image``, removed after."""
    command = [json.dumps(dataclasses.asdict(code))]
    if environment is not None:
        command.append(json.dumps({"type": environment.type, "args": environment.args}))
    container = client.containers.create(
        image,
        entrypoint=["python", "-m", "distributed.images.code_check"],
        command=command,
        network_disabled=True,
    )
    try:
        container.start()
        code_of = int(container.wait(timeout=CHECK_TIMEOUT_S).get("StatusCode", 1))
        return code_of, container.logs(stdout=True, stderr=True).decode(errors="replace").strip()
    finally:
        with contextlib.suppress(Exception):  # the engine gone: the error above says so
            container.remove(force=True)


def code_from(document: str) -> CodeConfig:
    """The :class:`CodeConfig` that :func:`check_image_imports` passes as JSON, read as the
    run's config is (a document it cannot read is this check's fault: ValueError)."""
    errors: list[str] = []
    code = from_mapping(CodeConfig, json.loads(document), "code", errors)
    if errors:
        raise ValueError("; ".join(errors))
    return code


def import_all(code: CodeConfig) -> None:
    """What a worker imports of the run's code: every import, and the entry point of every
    registration (which a worker imports only as it builds the component)."""
    from api import registry

    load_code(code)
    for r in code.registrations:
        registry.REGISTRIES[r.kind].spec(r.name).load()


def build_environment(document: str) -> None:
    """Build the environment ``{"type": ..., "args": ...}`` once, as an actor does, and close
    it."""
    from api import environment as env_api

    component = json.loads(document)
    env_api.make(component["type"], **component["args"]).close()


def main(argv: list[str]) -> int:
    try:
        import_all(code_from(argv[0]))
    except UserError as e:
        print(e, file=sys.stderr)
        return CANNOT_IMPORT
    if len(argv) < 2:
        return 0
    try:
        build_environment(argv[1])
    except Exception as e:  # whatever failed is reported
        from system.run.worker_process import import_failed

        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return MISSING_PACKAGE if import_failed(e) else CANNOT_BUILD
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
