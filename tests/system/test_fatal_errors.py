"""Which worker errors end a run at once (``worker_process.fatal``): those that every restart
would meet again. A package missing from the machine or the worker image was restarted five
times in every role that builds the environment before the run gave up on it
(``troupe train --launcher docker`` of a PettingZoo game, with an image built without
PettingZoo)."""

from __future__ import annotations

import pytest
from e2e_support import run_failing_file

from api.errors import RegistryError, UserError
from system.run.worker_process import fatal, said_in_full


def _raised_from(error: Exception, cause: Exception) -> Exception:
    try:
        try:
            raise cause
        except Exception as e:
            raise error from e
    except Exception as e:
        return e


def _in_a_fallback() -> Exception:
    try:
        try:
            import troupe_no_such_accelerator  # noqa: F401
        except ImportError:
            raise ConnectionRefusedError("the fallback's server")  # noqa: B904
    except Exception as e:
        return e


def test_an_import_that_failed_while_building_is_fatal_and_only_then():
    missing = _raised_from(UserError("PettingZoo environments need the 'pettingzoo' package"),
                           ModuleNotFoundError("No module named 'pettingzoo'"))  # fmt: skip
    assert fatal(missing, built=False)
    assert fatal(ModuleNotFoundError("No module named 'cv2'"), built=False)
    assert not fatal(missing, built=True)  # in the loop: not a build that failed
    assert not fatal(UserError("step() called but no episode is running"), built=False)
    assert not fatal(_raised_from(RuntimeError("lost"), OSError("reset by peer")), built=False)
    assert not fatal(_in_a_fallback(), built=False)  # only a cause counts, not a context
    assert fatal(RegistryError("unknown environment"), built=True)  # as before
    assert fatal(ValueError("bad argument"), built=False) and not fatal(ValueError(), built=True)


def test_a_user_error_of_troupes_own_checks_goes_without_its_traceback(tmp_path):
    """An observation that did not fit its space came to the console with 30 lines of
    traceback into the actor's loop, which said nothing its message did not. One raised from
    the user's code keeps its traceback: there it shows where the user's code failed."""
    from api.env_check import EnvironmentCheckError
    from system.streams.validation import check_action

    try:
        check_action("default", 0, [1, 2], __import__("gymnasium").spaces.Discrete(2))
    except UserError as e:
        own = e.with_traceback(e.__traceback__.tb_next)  # as caught in the worker's own code
    assert said_in_full(own)
    users = tmp_path / "troupe_users_env.py"
    users.write_text("def step():\n    raise RuntimeError('boom')\n")
    step = __import__("api.user_code", fromlist=["x"]).import_file(users).step
    try:
        try:
            step()
        except RuntimeError as err:
            raise EnvironmentCheckError("environment raised in step()") from err
    except UserError as e:
        from_users = e.with_traceback(None)  # raised here: only its cause's frames are judged
    assert not said_in_full(from_users)
    assert not said_in_full(KeyError("a bug of ours: its traceback is for us"))
    assert not said_in_full(UserError("never raised: no traceback to judge"))


EXPERIMENT_FILE = '''\
from api.config import ComponentConfig
from api.environment import register
from api.errors import UserError
from legacy.experiments.examples import cartpole_ppo


class NeedsAPackage:
    """An environment whose simulator is not installed here."""

    def __init__(self):
        try:
            import troupe_no_such_simulator  # noqa: F401
        except ImportError as e:
            raise UserError(f"NeedsAPackage needs troupe_no_such_simulator ({e})") from e


register("NeedsAPackage-v0", NeedsAPackage)


def experiment():
    config = cartpole_ppo()
    config.environment = ComponentConfig("NeedsAPackage-v0")
    return config
'''


@pytest.mark.multiprocess
def test_a_missing_package_ends_the_run_at_once_without_a_restart(tmp_path):
    stderr, summary, workers = run_failing_file(tmp_path, "needs_a_package.py", EXPERIMENT_FILE)
    said = "UserError: NeedsAPackage needs troupe_no_such_simulator"
    assert said in summary["failure"], summary["failure"]
    assert all(w["restarts"] == 0 for w in workers.values()), workers
    assert "restarting" not in stderr
