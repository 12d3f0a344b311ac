"""PPO's minibatch steps through CUDA graphs (``PPOTrainer(cuda_graphs=True)``): the same updates
as the eager trainer.

The CPU tests run the graph-ready path (static pool, padded minibatches, masked means) as plain
calls, against the eager trainer on the same batches; the ones marked ``cuda`` capture the graphs
and are skipped without a GPU.
"""

from __future__ import annotations

import copy
import logging

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.modules import graphed_minibatches
from algorithm.modules.graphed_minibatches import padded_minibatches
from algorithm.ppo.trainer import PPOTrainer

OBS = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
FRAMES = gym.spaces.Box(0, 255, shape=(4, 36, 36), dtype=np.uint8)
TF32 = 2e-3
"""On a GPU a graph's padded minibatches may take other cuBLAS/cuDNN algorithms than the eager
steps, and Adam turns a gradient's rounding into a step of the learning rate's size wherever
that gradient is near zero: parameters agree to about 1e-3. The GPU tests compare in plain
float32 (:func:`float32_products`): under TF32, which the recipes use, the two trainers' mean
pre-clip gradient norms once differed by 0.56% on an H200 (2026-12-04), with every other
figure within 0.2%."""
SMOOTH = dict(lr=1e-4, epochs=2, minibatches=4)
"""The GPU tests' trainer: ratios stay near 1, so that no row sits at the clip's edge. There a
rounding difference switches a row's gradient on or off, and the two trainers part ways (these
tests run on the CPU at lr 1e-3 counted one row in 112 clipped by one trainer, not the other)."""
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.fixture
def float32_products(monkeypatch):
    """Products in float32, not TF32, for the test's policies (which turn TF32 on when they
    pick a GPU: :func:`algorithm.policy.tune_cuda`); the process's switches restored after."""
    import algorithm.policy

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    monkeypatch.setattr(algorithm.policy, "tune_cuda", lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _twins(space=OBS, device="cpu", **trainer_args):
    """A graphed trainer and an eager one, on two identical policies."""
    hidden = [] if space is FRAMES else [16]
    policy_args = trainer_args.pop("policy_args", {})
    trainers = []
    for graphs in (True, False):
        policy = ActorCriticPolicy(
            observation_space=space,
            action_space=gym.spaces.Discrete(3),
            seed=0,
            hidden_sizes=hidden,
            device=device,
            **policy_args,
        )
        args = {**dict(lr=1e-3, seed=0, minibatches=3, value_clip=0.2), **trainer_args}
        trainers.append(PPOTrainer(policy, cuda_graphs=graphs, **args))
    return trainers


def _assert_same(graphed, eager, batches, atol=1e-5):
    for batch in batches:
        g, e = graphed.step(batch).stats, eager.step(batch).stats
        # said in the metrics: how many sizes replay as graphs (none for a recurrent policy)
        assert g.pop("minibatch_graphs") == (graphed._graphs.graphs if graphed._graphs else 0)
        # a ratio within rounding of the clip's edge may count on one side here, on the other
        # there: a few rows in the step's hundred
        assert g.pop("clip_fraction") == pytest.approx(e.pop("clip_fraction"), abs=0.05)
        assert g == pytest.approx(e, rel=max(1e-3, atol), abs=atol)
    for a, b in zip(graphed.policy.parameters(), eager.policy.parameters(), strict=True):
        torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=atol, atol=atol)


def test_minibatches_are_padded_with_row_zero_at_weight_zero():
    index, weight = padded_minibatches([np.array([5, 2, 7]), np.array([1, 4])])
    assert index.tolist() == [[5, 2, 7], [1, 4, 0]]
    assert weight.tolist() == [[1, 1, 1], [1, 1, 0]]
    index, weight = padded_minibatches([np.array([3])], rows=2)
    assert index.tolist() == [[3, 0]] and weight.tolist() == [[1, 0]]


@pytest.mark.parametrize("space", [OBS, FRAMES], ids=["vector", "frames"])
def test_padded_minibatches_train_as_the_eager_ones(make_batch, space):
    graphed, eager = _twins(space, lr_schedule="linear", total_steps=10)
    assert graphed._graphs is not None and eager._graphs is None
    # 8 steps of 4 segments: 28 valid transitions at most, in minibatches of 10, 9 and 9 (or
    # fewer): every step has a padded one; segment counts change, so the pool's rows do too
    batches = [make_batch(eager.policy, space, steps=8, segments=s, seed=s) for s in (4, 3, 5, 4)]
    _assert_same(graphed, eager, batches)
    assert graphed._graphs.graphs == 0  # no GPU: nothing captured, the same buffers as calls


def test_the_static_pool_grows_only_for_a_larger_batch(make_batch):
    graphed, _ = _twins()
    graphed.step(make_batch(graphed.policy, OBS, steps=8, segments=4))
    pool, capacity = graphed._graphs._pool, graphed._graphs._capacity
    sizes = list(graphed._graphs._sizes)
    graphed.step(make_batch(graphed.policy, OBS, steps=8, segments=2))
    assert graphed._graphs._pool is pool  # fewer rows: the same buffers,
    assert list(graphed._graphs._sizes) == sizes  # and minibatches padded to the same size
    graphed.step(make_batch(graphed.policy, OBS, steps=8, segments=8))
    assert graphed._graphs._capacity > capacity and graphed._graphs._pool is not pool


def test_a_recurrent_policy_trains_without_graphs(make_batch, caplog):
    with caplog.at_level(logging.WARNING):
        graphed, eager = _twins(policy_args=dict(rnn_hidden=8))
    assert graphed._graphs is None and "feed-forward" in caplog.text
    _assert_same(graphed, eager, [make_batch(eager.policy, OBS, steps=8, segments=4)])


@pytest.mark.timeout(300, method="thread")  # a hang in gloo's C++ ends the test, not CI
def test_data_parallel_training_stays_eager(make_batch, gloo_group, monkeypatch):
    graphed, _ = _twins()
    graphed.policy.distributed_setup()
    monkeypatch.setattr(graphed._graphs, "run", pytest.fail)
    assert graphed.step(make_batch(graphed.policy, OBS, 5, 4)).step == 1


def test_a_learning_rate_tensor_is_filled_in_place_and_checkpointed_as_a_number(make_batch):
    graphed, eager = _twins(lr_schedule="linear", total_steps=10)
    graphed.step(make_batch(graphed.policy, OBS, 5, 4))
    graphed._graphs._sizes[99] = "a captured size"
    # as a capturable Adam on a GPU has it: the learning rate a tensor that a graph reads
    graphed.capturable, lr = True, torch.tensor(1.0)
    for group in graphed.optimizer.param_groups:
        group["lr"] = lr
    graphed._steps = 5
    assert graphed._set_lr() == pytest.approx(5e-4)
    assert graphed.optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(5e-4)
    groups = graphed.get_checkpoint()["optimizer"]["param_groups"]
    assert [type(g["lr"]) for g in groups] == [float] and groups[0]["lr"] == pytest.approx(5e-4)
    graphed.load_checkpoint(eager.get_checkpoint())  # eager's Adam: lr 1e-3, as built
    loaded = graphed.optimizer.param_groups[0]["lr"]
    assert isinstance(loaded, torch.Tensor) and loaded is not lr
    assert float(loaded) == pytest.approx(1e-3)
    assert graphed._graphs._sizes == {}  # new optimizer state: every size captures again


# ----------------------------------------------------------------- on a GPU


@cuda
@pytest.mark.parametrize("fused", [False, True])
def test_captured_minibatches_train_as_the_eager_ones_on_a_gpu(make_batch, fused, float32_products):
    graphed, eager = _twins(
        FRAMES, "cuda", fused_adam=fused, lr_schedule="linear", total_steps=10, **SMOOTH
    )
    group = graphed.optimizer.param_groups[0]
    assert group["capturable"] and isinstance(group["lr"], torch.Tensor)
    batches = [make_batch(eager.policy, FRAMES, steps=9, segments=4, seed=s) for s in range(3)]
    # 8 minibatches a step: a size's first WARMUP on a side stream, then its captured graph (a
    # batch with more valid transitions than those before it brings a larger size)
    _assert_same(graphed, eager, batches, atol=TF32)
    sizes = graphed._graphs._sizes.values()
    assert sizes and all(size.graph is not None for size in sizes)
    assert float(group["lr"]) == pytest.approx(1e-4 * (1 - 2 / 10))  # the schedule, in place


@cuda
def test_loading_a_checkpoint_captures_again_on_a_gpu(make_batch, float32_products):
    graphed, eager = _twins(FRAMES, "cuda", **SMOOTH)
    batch = make_batch(eager.policy, FRAMES, steps=9, segments=4)
    for trainer in (graphed, eager):
        trainer.step(batch)
        trainer.step(batch)
    assert graphed._graphs.graphs == 1
    # a copy, as a checkpoint comes off the wire: a state_dict holds the optimizer's own tensors
    graphed.load_checkpoint(copy.deepcopy(eager.get_checkpoint()))
    graphed.policy.load_checkpoint(eager.policy.get_checkpoint())
    assert graphed._graphs.graphs == 0
    _assert_same(graphed, eager, [batch, batch], atol=TF32)
    assert graphed._graphs.graphs == 1


@cuda
def test_a_step_that_cannot_be_captured_trains_eagerly_on_a_gpu(
    make_batch, caplog, monkeypatch, float32_products
):
    graphed, eager = _twins(FRAMES, "cuda", **SMOOTH)
    update = graphed._graphs.update

    def reads_back(*args):
        row = update(*args)
        float(row[0])  # a host read: refused while capturing
        return row

    monkeypatch.setattr(graphed._graphs, "update", reads_back)
    batches = [make_batch(eager.policy, FRAMES, steps=9, segments=4, seed=s) for s in range(2)]
    with caplog.at_level(logging.WARNING, logger=graphed_minibatches.__name__):
        _assert_same(graphed, eager, batches, atol=TF32)
    # the capture was tried at minibatch WARMUP + 1 of the first step's 8, and only once
    assert caplog.text.count("without graphs") == 1 and not graphed._graphs.capture
