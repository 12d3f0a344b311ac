"""Population-based training's decisions (who exploits whom, how hyper-parameters are explored)
and the controller's driver on a real global state store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from api.config import ExperimentConfig, apply_overrides, make_experiment, validate
from api.config.league import PBTConfig
from api.errors import ConfigError
from system.run.coordination import pbt_rules as pbt
from system.run.coordination.pbt import HISTORY_FILE, PLOT_FILE, PBTDriver, applied_key, order_key
from system.run.coordination.state import StateStore
from system.run.episodes import EpisodeRecord


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_only_the_bottom_share_exploits_and_only_a_better_top_member():
    scores = {"a": 10.0, "b": 50.0, "c": 30.0, "d": 40.0}
    assert pbt.choose_source("a", scores, 0.25, rng()) == "b"  # worst copies the best
    for member in ("b", "c", "d"):
        assert pbt.choose_source(member, scores, 0.25, rng()) is None
    # with a share of 2, the two worst each copy one of the two best, chosen at random
    picks = {pbt.choose_source("c", scores, 0.5, rng(s)) for s in range(40)}
    assert picks == {"b", "d"}
    assert pbt.choose_source("a", {"a": 5.0, "b": 5.0}, 0.5, rng()) is None  # none is better
    assert pbt.choose_source("a", {"a": 5.0}, 0.5, rng()) is None  # nobody to rank against
    assert pbt.choose_source("z", scores, 0.5, rng()) is None  # not scored yet


def test_explore_perturbs_by_the_factors_and_stays_in_range():
    config = PBTConfig(
        hyperparameters={"lr": [1e-4, 1e-2], "entropy_coef": [0.0, 0.05]},
        perturb_factors=[0.5, 2.0],
    )
    seen = set()
    for s in range(30):
        out = pbt.explore({"lr": 1e-3, "entropy_coef": 0.04}, config, rng(s))
        seen.add(out["lr"])
        assert out["entropy_coef"] in (0.02, 0.05)  # 0.08 is clipped to the top of its range
    assert seen == {5e-4, 2e-3}
    high = pbt.explore({"lr": 8e-3, "entropy_coef": 0.0}, config, rng(1))
    assert high["lr"] in (4e-3, 1e-2)


def test_resampling_draws_from_the_range():
    config = PBTConfig(hyperparameters={"lr": [1e-4, 1e-2]}, resample_probability=1.0)
    draws = [pbt.explore({"lr": 1e-3}, config, rng(s))["lr"] for s in range(200)]
    assert min(draws) >= 1e-4 and max(draws) <= 1e-2
    assert min(draws) < 3e-4 and max(draws) > 3e-3  # log-uniform: both decades are reached


def test_a_whole_number_hyperparameter_is_explored_in_whole_numbers(tmp_path):
    """`pbt.hyperparameters={"epochs": [1, 10]}` gave a member 4.8 epochs: every trainer of it
    then failed in `range()`, restarted in a loop, and the run exited 0 (`minibatches=1.6` was
    logged and cut to 1). A trainer's `int` argument is explored in whole numbers, a factor
    that rounding would undo moves it one step, and the range is kept."""
    config = PBTConfig(hyperparameters={"epochs": [1, 10]}, perturb_factors=[0.8, 1.2])
    whole = frozenset({"epochs"})
    seen = {pbt.explore({"epochs": 4}, config, rng(s), whole)["epochs"] for s in range(30)}
    assert seen == {3, 5} and all(type(v) is int for v in seen)
    assert {pbt.explore({"epochs": 1}, config, rng(s), whole)["epochs"] for s in range(30)} == {
        1, 2}  # fmt: skip
    assert {pbt.explore({"epochs": 10}, config, rng(s), whole)["epochs"] for s in range(30)} == {
        8, 10}  # fmt: skip
    drawn = PBTConfig(hyperparameters={"epochs": [1, 10]}, resample_probability=1.0)
    draws = {pbt.explore({"epochs": 4}, drawn, rng(s), whole)["epochs"] for s in range(200)}
    assert draws <= set(range(1, 11)) and len(draws) > 5
    # the driver knows which they are from the trainer's signature, and starts from the config's
    overrides = ['pbt.hyperparameters={"epochs": [1, 10], "lr": [1e-5, 1e-2]}']
    config = make_experiment("cartpole-pbt", overrides)
    driver = PBTDriver(config, StateStore(), tmp_path)
    assert driver.whole == {"epochs"}
    assert all(type(m.hyperparameters["epochs"]) is int for m in driver.members.values())
    with pytest.raises(ConfigError, match=r"epochs: the trainer takes it as a whole number"):
        make_experiment("cartpole-pbt", ['pbt.hyperparameters={"epochs": [2.2, 2.9]}'])


def test_a_trainer_keeps_a_whole_number_attribute_whole():
    from api.trainer import Trainer

    class Counting(Trainer):
        policy = None

        def __init__(self):
            self.epochs, self.lr = 4, 1e-3

        def step(self, samples):  # pragma: no cover - not stepped here
            raise NotImplementedError

    trainer = Counting()
    trainer.set_hyperparameters({"epochs": 4.8, "lr": 2})
    assert trainer.epochs == 5 and type(trainer.epochs) is int
    assert trainer.lr == 2.0 and type(trainer.lr) is float


def population(tmp_path, **pbt_overrides) -> tuple[ExperimentConfig, StateStore, PBTDriver]:
    config = make_experiment("cartpole-pbt", [f"pbt.{k}={v}" for k, v in pbt_overrides.items()])
    store = StateStore()
    return config, store, PBTDriver(config, store, tmp_path)


def report(driver: PBTDriver, steps: int, returns: dict[str, float], episodes: int = 8) -> None:
    for name, value in returns.items():
        driver.on_train_stats(name, {"steps": steps, "version": steps})
        played = {"episode_return": value, f"policy/{name}/episode_return": value}
        driver.on_eval_episodes([EpisodeRecord.from_wire(played)] * episodes)


def test_the_worst_ready_member_is_ordered_to_copy_and_waits_until_it_is_applied(tmp_path):
    config, store, driver = population(tmp_path)
    returns = {"member0": 20.0, "member1": 200.0, "member2": 100.0, "member3": 150.0}
    report(driver, 5, returns)
    assert driver.on_record({})["pbt/best_score"] == 200.0
    assert store.get(order_key("member0")) == (None, 0)  # not ready: 5 of 10 steps
    report(driver, 10, returns)
    driver.on_record({})
    order, version = store.get(order_key("member0"))
    assert version == 1 and order["source"] == "member1" and order["generation"] == 1
    for name, value in order["hyperparameters"].items():
        start = config.policies["member1"].trainer.args[name]
        assert any(value == pytest.approx(start * f) for f in (0.8, 1.25))
    for other in ("member1", "member2", "member3"):
        assert store.get(order_key(other)) == (None, 0)

    report(driver, 25, returns)  # ready again by steps, but its order is not applied yet
    driver.on_record({})
    assert store.get(order_key("member0"))[1] == 1
    store.set(applied_key("member0"), {"generation": 1, "source": "member1", "version_after": 11})
    driver.on_record({})
    assert len(driver.members["member0"].returns) == 0  # its old weights' returns are gone
    driver.close()
    events = [json.loads(line) for line in (tmp_path / HISTORY_FILE).read_text().splitlines()]
    kinds = [(e["event"], e["member"]) for e in events]
    assert ("exploit", "member0") in kinds and ("applied", "member0") in kinds
    assert kinds.index(("exploit", "member0")) < kinds.index(("applied", "member0"))
    assert {"ready", "final"} <= {e["event"] for e in events}
    assert (tmp_path / PLOT_FILE).stat().st_size > 0
    assert driver.summary()["exploits_applied"] == 1


def test_a_member_is_ranked_against_the_whole_population_not_those_scored_at_the_moment(tmp_path):
    """With two of four members scored, the worse of the two was in the "bottom quarter" and
    copied the other. A decision waits for every member's standing; a member that just copied
    stands, until its new weights have episodes of their own, at the score it copied."""
    _, store, driver = population(tmp_path)
    report(driver, 10, {"member0": 20.0, "member1": 200.0})
    driver.on_record({})
    assert store.get(order_key("member0")) == (None, 0)  # members 2 and 3 have no score yet
    report(driver, 10, {"member2": 100.0, "member3": 150.0})
    driver.on_record({})
    assert store.get(order_key("member0"))[0]["source"] == "member1"
    store.set(applied_key("member0"), {"generation": 1, "source": "member1"})
    driver.on_record({})
    assert driver.members["member0"].standing(8) == 200.0  # member1's, until it plays 8
    report(driver, 20, {"member1": 200.0, "member2": 100.0, "member3": 150.0})
    driver.on_record({})  # member2 is the bottom quarter of four, member0 counted at 200
    assert store.get(order_key("member2"))[0]["source"] in {"member0", "member1"}
    assert store.get(order_key("member3")) == (None, 0)
    driver.close()


def test_a_resumed_driver_goes_on_from_the_orders_in_the_state(tmp_path):
    _, store, _ = population(tmp_path)
    hyperparameters = {"lr": 5e-3, "entropy_coef": 0.01}
    order = {"generation": 3, "source": "member1", "hyperparameters": hyperparameters}
    store.set(order_key("member2"), order)
    config = make_experiment("cartpole-pbt")
    again = PBTDriver(config, store, tmp_path)
    assert again.members["member2"].generation == 3
    assert again.members["member2"].hyperparameters["lr"] == 5e-3


def test_a_resumed_driver_s_history_goes_on_from_its_last_lines(tmp_path):
    """pbt.jsonl of a resumed run: its clock goes on (it restarted from 0), and a member's
    step, version and last decision are its lines', not 0 until its trainer reports."""
    _, _, driver = population(tmp_path)
    report(driver, 12, {"member0": 20.0, "member1": 200.0, "member2": 100.0, "member3": 150.0})
    driver.on_record({})
    driver.close()
    lines = (tmp_path / HISTORY_FILE).read_text().splitlines()
    last = max(json.loads(line)["wall_s"] for line in lines)
    (tmp_path / HISTORY_FILE).write_text("\n".join([*lines, '{"torn": ', "[1, 2]"]) + "\n")
    again = PBTDriver(make_experiment("cartpole-pbt"), StateStore(), tmp_path)
    member = again.members["member0"]
    assert (member.steps, member.version, member.last_decision_step) == (12, 12, 12)
    played = {"episode_return": 30.0, "policy/member0/episode_return": 30.0}
    again.on_eval_episodes([EpisodeRecord.from_wire(played)] * 10)  # before any trainer stats
    again.close()
    written = (tmp_path / HISTORY_FILE).read_text().splitlines()[len(lines) + 2 :]
    (final,) = [json.loads(line) for line in written if '"final"' in line]
    assert final["member"] == "member0" and final["score"] == 30.0
    assert final["step"] == final["version"] == 12 and final["wall_s"] >= last


def test_pbt_config_errors_name_the_field():
    config = make_experiment("cartpole-pbt")
    bad = apply_overrides(config, [])
    bad.pbt.members = ["member0", "nobody"]
    bad.pbt.hyperparameters = {"lr": [1e-2, 1e-4], "value_coef": [0.1, 1.0]}
    bad.actors.workers = 3
    bad.stop.eval_return = 400.0
    errors = "\n".join(validate(bad))
    for expected in (
        "pbt.members: 'nobody' is not a policy",
        "pbt.hyperparameters.lr: must be [low, high]",
        "policies.member0.trainer.args.value_coef: PBT explores 'value_coef'",
        "actors.workers: 3 cannot be dealt out evenly to 2 PBT members",
        "stop.eval_return: averages every member's evaluation",
    ):
        assert expected in errors


def test_a_population_s_keys_without_a_population_are_refused():
    """`pbt.target_return=100` on cartpole-ppo was accepted, shown as a stop rule ("or a PBT
    member's score 100") and never applied: there were no members to score."""
    for override in ("pbt.target_return=0", 'pbt.hyperparameters={"lr": [1e-4, 1e-2]}'):
        with pytest.raises(ConfigError, match=r"set without pbt.members \(no population\)"):
            make_experiment("cartpole-ppo", [override])
    make_experiment("cartpole-ppo", ["pbt.interval_steps=5"])  # a default-like key: harmless


def test_a_population_stopped_on_its_target_is_solved(tmp_path):
    """Issue 26: PBT stopping because a member reached ``pbt.target_return`` reported
    ``"solved": false``; a target met is a solved run, whichever rule held it."""
    from system.run.finish import finish_run
    from system.run.stopping import EvaluationWindows

    config = make_experiment("cartpole-pbt", ["pbt.target_return=400"])
    record = {"wall_s": 1.0, "env_frames": 100, "fps": 10.0}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    summary = finish_run(
        config, tmp_path, wall_s=1.0, stop_reason="pbt_target_return", failure=None,
        evaluation=EvaluationWindows(None, 10), extra={}, write=lambda write: write() or True,
    )  # fmt: skip
    assert summary["solved"] is True and summary["stop_reason"] == "pbt_target_return"
    # the target the run had, not null beside "solved": true (the population's, named so)
    assert summary["target"] == 400.0
    assert summary["target_source"].startswith("pbt.target_return: met when a member's score")
    on_frames = finish_run(
        config, tmp_path, wall_s=1.0, stop_reason="env_frames", failure=None,
        evaluation=EvaluationWindows(None, 10), extra={}, write=lambda write: write() or True,
    )  # fmt: skip
    assert on_frames["solved"] is False


def test_a_hyperparameter_the_trainer_does_not_take_is_said_once_with_the_close_name():
    """``pbt.hyperparameters={"lrr": ...}`` was told, once per member, to give the member's
    starting value of 'lrr', which PPO would then refuse."""
    config = make_experiment("cartpole-pbt")
    config.pbt.hyperparameters = {"lrr": [1e-5, 1e-2]}
    assert validate(config) == [
        "pbt.hyperparameters.lrr: unknown key; did you mean 'lr'? "
        "(algorithm.ppo.trainer:PPOTrainer takes no 'lrr')"
    ]
