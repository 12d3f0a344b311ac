"""The error hierarchy every Troupe component raises.

Two families, kept apart on purpose: a ``UserError`` means the user's code or configuration is
wrong and the message says what to change; an ``OperationalError`` means the system met a
condition at run time (a peer went silent, a socket timed out, a worker died) and the message says
what happened and what the runtime or the user can do about it.
"""

from __future__ import annotations


class TroupeError(Exception):
    """Base class of every error Troupe raises on purpose."""


class UserError(TroupeError):
    """The user's code or configuration is wrong; the message says what to change."""


class RegistryError(UserError):
    """A name is unknown, registered twice, or its entry point cannot be loaded."""


class ConfigError(UserError):
    """An experiment configuration is invalid. ``errors`` lists every problem found."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        lines = "\n".join(f"  - {e}" for e in self.errors)
        count = f"{len(self.errors)} error" + ("s" if len(self.errors) != 1 else "")
        super().__init__(f"invalid experiment configuration ({count}):\n{lines}")


class NamedArrayError(UserError):
    """A NamedArray was built, assigned or combined in a way its declaration does not allow."""


class EnvironmentCheckError(UserError):
    """An environment broke the Environment contract (found by ``test_environment``).

    ``agent`` and ``field`` name where the problem is, when it is tied to one.
    """

    def __init__(self, message: str, *, agent: int | None = None, field: str | None = None):
        self.agent = agent
        self.field = field
        where = []
        if agent is not None:
            where.append(f"agent {agent}")
        if field is not None:
            where.append(f"field '{field}'")
        prefix = f"[{', '.join(where)}] " if where else ""
        super().__init__(prefix + message)


class NonFiniteError(UserError):
    """An environment returned a NaN or infinite observation or reward, or a policy such an
    action; the message names the environment, agent and step."""


class PipelineCheckError(UserError):
    """Environment, policy and trainer do not fit together (found by ``test_pipeline``)."""


class OperationalError(TroupeError):
    """A run-time condition outside the user's code: lost peers, timeouts, dead workers."""


class RunFolderError(OperationalError):
    """The run folder cannot be written: the disk is full, read-only, or not ours to write."""

    @classmethod
    def from_os_error(cls, path: object, error: OSError) -> RunFolderError:
        """One line: which file, why, and what to do about it."""
        import errno

        why = error.strerror or str(error)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            advice = (
                "free space on that disk (or move the run folder to one with room), then "
                "continue the run with `troupe run --resume RUN_DIR`"
            )
        elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            advice = "make the run folder writable, or pick another one with --run-dir"
        elif error.errno in (errno.EEXIST, errno.ENOTDIR) and (file := _file_on(path)):
            return cls(f"cannot write {path}: {file} is a file where a folder must be; pick "
                       "another --run-dir (or move the file away)")  # fmt: skip
        else:
            advice = "check the disk holding the run folder"
        return cls(f"cannot write {path}: {why}; {advice}")


def _file_on(path: object) -> str | None:
    """The file that stands where ``path`` or one of its parents must be a folder, if any."""
    from pathlib import Path

    for place in (Path(str(path)), *Path(str(path)).parents):
        if place.exists() or place.is_symlink():
            return None if place.is_dir() else str(place)
    return None
