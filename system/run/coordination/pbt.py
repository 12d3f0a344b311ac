"""Population-based training in a run: the controller's driver and each member's follower.

The driver follows each member's trainer steps (heartbeat stats) and evaluation returns (its own
evaluation actors' episodes), and when a member is ready applies :mod:`.pbt_rules`'
decisions. An exploit is an *order* in the global state, ``pbt/<member>/order`` =
``{generation, source, hyperparameters}``; the member's trainer carries it out
(:class:`PBTMember`: the source's weights through the parameter service, the new
hyper-parameters without a restart) and reports under ``pbt/<member>/applied``. Until then the
member is not ranked again, and its old evaluation returns are dropped once the order is applied.

The population's history goes to ``pbt.jsonl`` in the run folder, one event a line: ``ready``
(a member's score, step, version and hyper-parameters at a decision), ``exploit`` (the order)
and ``applied`` (what its trainer did: versions and weight digests before and after); and at the
end to ``pbt.png``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from api.config import ExperimentConfig
from api.config.league import whole_hyperparameters
from api.errors import ConfigError, UserError
from api.global_state import GlobalState
from system import run_folder
from system.logs import NOTICE
from system.run.coordination import pbt_rules as pbt
from system.run.coordination.pbt_rules import Member
from system.run.episodes import EpisodeRecord

logger = logging.getLogger(__name__)

HISTORY_FILE = run_folder.PBT_EVENTS
PLOT_FILE = "pbt.png"


def order_key(member: str) -> str:
    return f"pbt/{member}/order"


def applied_key(member: str) -> str:
    return f"pbt/{member}/applied"


class PBTDriver:
    def __init__(self, config: ExperimentConfig, state: GlobalState, run_dir: Path):
        self.config = config.pbt
        self.state = state
        self.run_dir = Path(run_dir)
        self.rng = np.random.default_rng(config.seed + 7_919)
        self.started = time.monotonic()
        self.whole = whole_hyperparameters(config)
        self.members = {m: Member(m, self._starting(config, m)) for m in self.config.members}
        for member in self.members.values():  # a resumed run goes on from its last orders
            order, _ = state.get(order_key(member.name))
            if isinstance(order, dict):
                member.generation = member.applied = int(order["generation"])
                member.hyperparameters = dict(order["hyperparameters"])
        self.started -= self._continue_history()

    def _starting(self, config: ExperimentConfig, member: str) -> dict[str, float]:
        args = config.policies[member].trainer.args
        return {
            k: int(args[k]) if k in self.whole else float(args[k])
            for k in self.config.hyperparameters
        }

    def _continue_history(self) -> float:
        """A resumed run's history goes on where it stopped: each member's step, version and
        last decision from its lines (a line written before its trainer reports would say 0),
        and the clock, whose seconds are returned (0.0 for a new run)."""
        try:
            lines = (self.run_dir / HISTORY_FILE).read_text().splitlines()
        except OSError:
            return 0.0
        wall = 0.0
        for line in lines:
            try:
                record = json.loads(line)
                member = self.members.get(record.get("member"))
                wall = max(wall, float(record.get("wall_s") or 0.0))
                if member is None:
                    continue
                member.steps = max(member.steps, int(record.get("step") or 0))
                member.version = max(member.version, int(record.get("version") or 0))
                if record.get("event") == "ready":
                    member.last_decision_step = int(record["step"])
            except (ValueError, TypeError, KeyError, AttributeError):  # a torn or foreign line
                continue
        return wall

    # ----------------------------------------------------------------- what the run reports
    def on_eval_episodes(self, episodes: list[EpisodeRecord]) -> None:
        for episode in episodes:
            for name, member in self.members.items():
                value = episode.policy_return(name)
                if value is not None:
                    member.returns.append(value)

    def on_train_stats(self, policy: str, stats: dict[str, float]) -> None:
        member = self.members.get(policy)
        if member is not None:
            member.steps = int(stats.get("steps", member.steps))
            member.version = int(stats.get("version", member.version))

    # ----------------------------------------------------------------- decisions
    def on_record(self, record: dict[str, Any]) -> dict[str, Any]:
        """Take applied orders, decide for the ready members; the metrics to add."""
        for member in self.members.values():
            self._take_applied(member)
        scores = self.scores()
        # Ranked against the whole population, or not yet: among the members scored at the
        # moment (a member that just copied has no episodes of its own), the bottom share of
        # 4 became the worse of 2, and a member in the middle was made to copy.
        standings = {m.name: m.standing(self.config.eval_episodes) for m in self.members.values()}
        whole = all(s is not None for s in standings.values())
        for member in self.members.values():
            if whole and member.ready(self.config):
                self._decide(member, scores[member.name], standings)
        out: dict[str, Any] = {f"pbt/{m}/score": s for m, s in scores.items()}
        out["pbt/best_score"] = max(scores.values()) if scores else None
        return out

    def scores(self) -> dict[str, float]:
        found = {m.name: m.score(self.config.eval_episodes) for m in self.members.values()}
        return {k: v for k, v in found.items() if v is not None}

    def _decide(self, member: Member, score: float, standings: dict[str, float]) -> None:
        member.last_decision_step = member.steps
        self._log("ready", member, score=score)
        source = pbt.choose_source(member.name, standings, self.config.truncation, self.rng)
        if source is None:
            return
        new = pbt.explore(self.members[source].hyperparameters, self.config, self.rng, self.whole)
        member.generation += 1
        order = {"generation": member.generation, "source": source, "hyperparameters": new}
        self.state.set(order_key(member.name), order)
        self._log(
            "exploit",
            member,
            source=source,
            score=score,
            source_score=standings[source],
            old_hyperparameters=member.hyperparameters,
            new_hyperparameters=new,
            generation=member.generation,
        )
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v!r}"
                          for k, v in new.items())  # fmt: skip
        logger.log(
            NOTICE,
            "pbt: %s (%.1f) copies %s (%.1f), hyper-parameters %s",
            *(member.name, score, source, standings[source], shown),
        )
        member.hyperparameters = new
        member.inherited = standings[source]

    def _take_applied(self, member: Member) -> None:
        applied, _ = self.state.get(applied_key(member.name))
        if not isinstance(applied, dict) or int(applied.get("generation", 0)) <= member.applied:
            return
        member.applied = int(applied["generation"])
        member.returns.clear()  # those were played by the weights it just replaced
        self._log("applied", member, **{k: v for k, v in applied.items() if k != "member"})

    def stop_reason(self) -> str:
        target = self.config.target_return
        scores = self.scores()
        if target is not None and scores and max(scores.values()) >= target:
            return "pbt_target_return"
        return ""

    # ----------------------------------------------------------------- history
    def _log(self, event: str, member: Member, **fields: Any) -> None:
        line = {
            "event": event,
            "member": member.name,
            "step": member.steps,
            "version": member.version,
            "wall_s": round(time.monotonic() - self.started, 3),
            "hyperparameters": member.hyperparameters,
            **fields,
        }
        with open(self.run_dir / HISTORY_FILE, "a") as f:
            f.write(json.dumps(line) + "\n")

    def summary(self) -> dict[str, Any]:
        """For summary.json: the best member, its score, and how many exploits were applied."""
        scores = self.scores()
        best = max(scores, key=scores.__getitem__) if scores else None
        target = self.config.target_return
        return {
            "best_member": best,
            "best_score": scores.get(best) if best else None,
            "scores": scores,
            "exploits_applied": sum(m.applied for m in self.members.values()),
            "target_return": target,
            "reached_target": bool(best and target is not None and scores[best] >= target),
        }

    def close(self) -> None:
        """Log every member's last score, then draw the population's history."""
        scores = self.scores()
        for member in self.members.values():
            if member.name in scores:
                self._log("final", member, score=scores[member.name])
        path = self.run_dir / HISTORY_FILE
        if not path.exists():
            return
        try:
            plot_history(path, self.run_dir / PLOT_FILE, list(self.config.hyperparameters))
        except OSError:
            raise  # the run folder's problem: the controller reports it
        except Exception:  # a picture is not worth failing the run's summary for
            logger.warning("could not draw %s", PLOT_FILE, exc_info=True)


def read_history(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def plot_history(history: Path, out: Path, hyperparameters: list[str]) -> None:
    """Scores by trainer step per member (exploits marked) and each hyper-parameter below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = read_history(history)
    members = sorted({e["member"] for e in events})
    fig, axes = plt.subplots(
        1 + len(hyperparameters),
        1,
        figsize=(8, 3 + 2 * len(hyperparameters)),
        sharex=True,
        squeeze=False,
    )
    for i, name in enumerate(members):
        color = f"C{i % 10}"
        ready = [e for e in events if e["member"] == name and e["event"] in ("ready", "final")]
        axes[0][0].plot(
            [e["step"] for e in ready],
            [e["score"] for e in ready],
            "-o",
            color=color,
            label=name,
            markersize=3,
        )
        for e in (e for e in events if e["member"] == name and e["event"] == "exploit"):
            axes[0][0].plot(e["step"], e["score"], "x", color=color, markersize=10)
        for row, hp in enumerate(hyperparameters, start=1):
            points = [
                (e["step"], e["hyperparameters"][hp])
                for e in events
                if e["member"] == name and e["event"] in ("ready", "applied", "final")
            ]
            if points:
                axes[row][0].step(*zip(*points), where="post", color=color)
            axes[row][0].set_ylabel(hp)
            axes[row][0].set_yscale("log" if all(p[1] > 0 for p in points) else "linear")
    axes[0][0].set_ylabel("evaluation return")
    axes[0][0].set_title("population (x: exploit, then a copy of a better member)")
    axes[0][0].legend(loc="lower right", fontsize="small")
    axes[-1][0].set_xlabel("trainer steps of the member")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------- a member's trainer
class PBTMember:
    """In the trainer of a PBT member, on every heartbeat: carry out ``pbt/<member>/order``.

    A new order means: fetch the source member's newest weights from the parameter service,
    load them into this trainer's policy under this member's next version (versions of a policy
    only grow, so its policy workers take the copy like any new version), publish them, and
    train on with the order's hyper-parameters (``Trainer.set_hyperparameters``: no restart).
    What was done goes to ``pbt/<member>/applied``, with digests of the weights before, of the
    source's and after, so the copy can be checked. A trainer restarted after it applied an
    order finds its weights already in the parameter service (they were published): it only
    sets the order's hyper-parameters again.
    """

    def __init__(self, state: GlobalState, worker: Any, starting: dict[str, float]):
        self.state = state
        self.worker = worker
        self.member = worker.policy_name
        self.seen = 0
        """The version of the order key last carried out."""
        self._set_hyperparameters(starting)  # an unknown name fails the run at once

    def __call__(self) -> None:
        order, version = self.state.get(f"pbt/{self.member}/order")
        if version == self.seen or not isinstance(order, dict):
            return
        self.seen = version
        self._set_hyperparameters(order["hyperparameters"])
        applied, _ = self.state.get(f"pbt/{self.member}/applied")
        if isinstance(applied, dict) and applied.get("generation", 0) >= order["generation"]:
            return  # restarted after applying it: the weights are the published ones
        report = self.copy_weights(str(order["source"]))
        report.update(generation=order["generation"], hyperparameters=order["hyperparameters"])
        self.state.set(f"pbt/{self.member}/applied", report)

    def copy_weights(self, source: str) -> dict[str, Any]:
        """Load ``source``'s newest published weights as this member's next version; publish."""
        policy = self.worker.trainer.policy
        version_before = policy.version
        digest_before = weights_digest(policy.get_checkpoint())
        source_version, params = self.worker.params.get(source)
        policy.load_checkpoint({**params, "version": version_before + 1})
        self.worker.publish(persist=False)
        self.worker.stats["pbt_exploits"] = self.worker.stats.get("pbt_exploits", 0) + 1
        logger.info("%s: copied %s v%d as v%d", self.member, source, source_version, policy.version)
        return {
            "source": source,
            "source_version": int(source_version),
            "version_before": int(version_before),
            "version_after": int(policy.version),
            "digest_before": digest_before,
            "digest_source": weights_digest(params),
            "digest_after": weights_digest(policy.get_checkpoint()),
        }

    def _set_hyperparameters(self, values: dict[str, float]) -> None:
        try:
            self.worker.trainer.set_hyperparameters(dict(values))
        except UserError as e:
            raise ConfigError([f"pbt.hyperparameters: {e}"]) from e
        for name, value in values.items():  # kept in the trainer's stats, so in metrics.jsonl
            self.worker.stats[f"hp/{name}"] = float(value)


def weights_digest(checkpoint: Any) -> str:
    """A digest of every array of a checkpoint (its ``version`` left out), in key order."""
    h = hashlib.sha256()
    for path, leaf in _leaves(checkpoint, ""):
        if path == "version":
            continue
        array = np.ascontiguousarray(_to_numpy(leaf))
        h.update(f"{path}:{array.dtype.str}:{array.shape}".encode())
        h.update(array.tobytes())
    return h.hexdigest()[:16]


def _leaves(node: Any, path: str):
    if isinstance(node, dict):
        for key in sorted(node, key=str):
            yield from _leaves(node[key], f"{path}.{key}" if path else str(key))
    else:
        yield path, node


def _to_numpy(leaf: Any) -> np.ndarray:
    if hasattr(leaf, "detach"):  # a torch tensor (not imported here: only its methods are used)
        return leaf.detach().cpu().numpy()
    return np.asarray(leaf)
