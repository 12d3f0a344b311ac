"""ZeroMQ CURVE for cluster runs: every socket authenticated and encrypted, keys made per run.

A run has two key pairs: the *server* pair, which every bound socket presents, and the *client*
pair, which every connecting socket presents. A connecting peer must know the server public key to
complete the handshake, and a ZAP handler in every process admits only the run's client public
key, so a stranger with neither secret cannot get a single message through, and cannot read any.

Keys reach a worker process through the environment: ``TROUPE_CURVE_KEYS`` (the four Z85 keys
separated by spaces: Z85 uses ``:`` itself) or ``TROUPE_CURVE_KEYS_FILE`` (a file holding that
text: how Docker Swarm and Kubernetes secrets are mounted). Without either, sockets are plain
(the local default: loopback only).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from api.errors import UserError

logger = logging.getLogger(__name__)

ENV_KEYS = "TROUPE_CURVE_KEYS"
ENV_KEYS_FILE = "TROUPE_CURVE_KEYS_FILE"


@dataclass(frozen=True)
class RunKeys:
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def generate(cls) -> RunKeys:
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, client_public, client_secret)

    def to_text(self) -> str:
        parts = (self.server_public, self.server_secret, self.client_public, self.client_secret)
        return " ".join(p.decode("ascii") for p in parts)

    @classmethod
    def from_text(cls, text: str) -> RunKeys:
        parts = text.split()
        if len(parts) != 4 or any(len(p) != 40 for p in parts):
            raise UserError(
                "CURVE keys must be four 40-character Z85 keys separated by spaces (server public, "
                "server secret, client public, client secret); make them with RunKeys.generate()"
            )
        return cls(*(p.encode("ascii") for p in parts))

    def save(self, path: Path) -> Path:
        """Write the keys readable by the owner only (a run folder's ``keys`` file)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.to_text())
        return path


_keys: RunKeys | None = None
_authenticator: ThreadAuthenticator | None = None


class _AdmitRunClients:
    """ZAP credentials provider: admit only the run's client public key."""

    def __init__(self, client_public: bytes):
        self.allowed = client_public

    def callback(self, domain: str, key: bytes) -> bool:
        admitted = key == self.allowed  # pyzmq hands the client's key over Z85-encoded
        if not admitted:
            logger.warning("refused a CURVE client with an unknown key")
        return admitted


def enable(keys: RunKeys, context: zmq.Context) -> None:
    """Turn CURVE on for every socket this process makes from now on."""
    global _keys, _authenticator
    if _authenticator is None:
        _authenticator = ThreadAuthenticator(context)
        _authenticator.start()
    _authenticator.configure_curve_callback(
        domain="*", credentials_provider=_AdmitRunClients(keys.client_public)
    )
    _keys = keys


def keys_from_environment() -> RunKeys | None:
    """The run's keys from the environment; None when neither variable is set (plain sockets).

    Fails closed: once either variable is set, security was asked for, so a file that is
    missing, unreadable or empty, or keys that are not keys, raise :class:`UserError` naming
    the variable (and file): a run never falls back to plain sockets unnoticed."""
    text = os.environ.get(ENV_KEYS)
    path = os.environ.get(ENV_KEYS_FILE)
    if text is not None and text.strip():
        return _parse(text, ENV_KEYS)
    if text is not None and not path:
        raise UserError(f"{ENV_KEYS} is set but empty; unset it, or give the run's four keys")
    if path is None:
        return None
    return load_keys_file(Path(path), f"{ENV_KEYS_FILE}={path}")


def load_keys_file(path: Path, source: str) -> RunKeys:
    """The keys in ``path`` (``source`` names where its name came from, for the message)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(
            f"{source}: the CURVE keys file cannot be read ({e.strerror or e}); point it at the "
            "run's keys file (`troupe run --secure` makes one in the run folder)"
        ) from e
    if not text.strip():
        raise UserError(
            f"{source}: the CURVE keys file is empty; the run refuses to go on without "
            "encryption. Restore the file, or remove it to have `--secure` make new keys"
        )
    return _parse(text, source)


def _parse(text: str, source: str) -> RunKeys:
    try:
        return RunKeys.from_text(text)
    except UserError as e:
        raise UserError(f"{source}: {e}") from None


def enabled() -> bool:
    return _keys is not None


def secure_server(sock: zmq.Socket) -> None:
    """Make a binding socket a CURVE server (no-op when CURVE is off)."""
    if _keys is None:
        return
    sock.curve_secretkey = _keys.server_secret
    sock.curve_publickey = _keys.server_public
    sock.curve_server = True


def secure_client(sock: zmq.Socket) -> None:
    """Make a connecting socket a CURVE client of the run's servers (no-op when CURVE is off)."""
    if _keys is None:
        return
    sock.curve_serverkey = _keys.server_public
    sock.curve_publickey = _keys.client_public
    sock.curve_secretkey = _keys.client_secret


def shutdown() -> None:
    global _authenticator, _keys
    if _authenticator is not None:
        _authenticator.stop()
    _authenticator, _keys = None, None
