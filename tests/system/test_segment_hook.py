"""Issue 28, item 1: the trajectory hook. An actor callback's ``on_segment`` sees each batch of
finished segments before it leaves a real actor, rewrites a field and fills the fields it
declares; the run's declared layout knows those fields, so a trainer's consumer takes the
segments off a real socket with them; a hook that breaks the layout, or a bad declaration, is
named."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq
from test_bad_messages import SEGMENT, real_segments

from api import registry
from api.config import ComponentConfig, make_experiment
from api.errors import ConfigError
from system.errors import CallbackError
from system.run import builders, declared
from system.streams import transport
from system.streams.samples import ZmqSampleConsumer
from system.workers.actor_hooks import ActorHooks


class Bonus:
    """A bonus per step from the whole batch at once, kept beside the reward and added to it."""

    segment_fields = {"bonus": ((1,), "float32"), "late": ((), "bool")}

    def __init__(self, scale: float = 0.5):
        self.scale = scale
        self.seen: list[tuple[str, dict]] = []

    def on_segment(self, segment, policy):
        self.seen.append((policy, {k: v.copy() for k, v in segment.extras.items()}))
        steps = np.arange(len(segment.reward), dtype=np.float32)
        segment.extras.bonus[:] = self.scale * steps[:, None, None]
        segment.extras.late[:] = steps[:, None] >= SEGMENT // 2
        segment.reward += segment.extras.bonus


class Reshaping:
    """Breaks the layout: a reward of another shape."""

    def on_segment(self, segment, policy):
        segment.reward = segment.reward[..., 0]
        return segment


class BadFields:
    segment_fields = {"bonus": "float32"}

    def on_segment(self, segment, policy):
        pass


@pytest.fixture
def callbacks():
    registry.register_callback("bonus-t28", Bonus, override=True)
    registry.register_callback("reshaping-t28", Reshaping, override=True)
    registry.register_callback("bad-fields-t28", BadFields, override=True)
    yield
    for name in ("bonus-t28", "reshaping-t28", "bad-fields-t28"):
        registry.callbacks.unregister(name)


def experiment(*callbacks: str):
    names = ", ".join(f"{{'type': '{c}'}}" for c in callbacks)
    return make_experiment(
        "cartpole-ppo",
        [
            f"actors.segment_length={SEGMENT}",
            "actors.envs_per_worker=2",
            "evaluation.envs_per_worker=2",
            f"actor_callbacks=[{names}]",
        ],
    )


def record(config, count: int, hooks: ActorHooks) -> list:
    """Chunks of segments from a real actor (with ``hooks``) answered by a real policy worker."""
    return real_segments(config, builders.probe_spaces(config), count, hooks)


def test_the_hook_rewrites_and_adds_fields_and_a_trainer_takes_them_off_a_socket(callbacks):
    config = experiment("bonus-t28")
    hooks = ActorHooks.of("actor/0", False, config.actor_callbacks)
    chunks = record(config, 3, hooks)
    hook = hooks.objects[0][1]
    assert [policy for policy, _ in hook.seen] == ["default"] * len(hook.seen)
    for _, extras in hook.seen:  # what the hook is handed: the declared fields, zero-filled
        assert extras["bonus"].shape[2:] == (1,) and not extras["bonus"].any()
        assert extras["late"].dtype == np.bool_ and not extras["late"].any()
    steps = np.arange(SEGMENT + 1, dtype=np.float32)
    for chunk in chunks:
        np.testing.assert_array_equal(chunk.extras.bonus[:, 0, 0], 0.5 * steps)
        # CartPole's reward is 1 a step (0 on the reset step): the bonus was added to it
        shaped = chunk.reward[:, :, 0] - chunk.extras.bonus[:, :, 0]
        assert set(np.unique(shaped)) <= {0.0, 1.0}

    spaces = builders.probe_spaces(config)
    policy = builders.make_policy(config, "default", spaces, 0)
    layout = declared.segment_layout(config, spaces, policy, "default")
    assert set(layout.step["extras"]) == {"bonus", "late"}
    consumer = ZmqSampleConsumer(layout=layout)
    sender = transport.make_socket(zmq.DEALER, server=False, hwm=100)
    sender.connect(consumer.endpoint)
    try:
        without = chunks[0][:, :]
        without.extras = None  # what an actor without the callback would send
        for chunk in [chunks[0], without, chunks[1]]:
            transport.send(sender, "samples", {"segment": chunk})
        got, deadline = [], time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got += consumer.poll(100, 10)
    finally:
        sender.close(linger=0)
        consumer.close()
    assert len(got) == 2 and consumer.bad_messages.count == 1
    np.testing.assert_array_equal(got[1].extras.bonus, chunks[1].extras.bonus)
    np.testing.assert_array_equal(got[1].extras.late, chunks[1].extras.late)


def test_a_hook_that_changes_the_layout_is_named(callbacks):
    config = experiment("reshaping-t28")
    hooks = ActorHooks.of("actor/0", False, config.actor_callbacks)
    with pytest.raises(CallbackError, match="'reshaping-t28' changed the segments' layout"):
        record(config, 1, hooks)


def test_bad_or_doubled_declarations_are_config_errors(callbacks):
    with pytest.raises(ConfigError, match=r"'bad-fields-t28'.segment_fields\['bonus'\]"):
        ActorHooks("actor/0", False, [ComponentConfig("bad-fields-t28")])
    doubled = [ComponentConfig("bonus-t28"), ComponentConfig("bonus-t28", {"scale": 2.0})]
    with pytest.raises(ConfigError, match="segment field 'bonus' is declared twice"):
        ActorHooks("actor/0", False, doubled)
    config = make_experiment("cartpole-ppo", [])
    config.actor_callbacks = doubled
    with pytest.raises(ConfigError, match="segment field 'bonus' is declared twice"):
        declared.extra_fields(config)
