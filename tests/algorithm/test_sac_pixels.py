"""SAC from pixels (``algorithm/sac/pixels.py``): the random shifts, an encoder trained by the
critics alone with a target copy, and the pipeline through the runtime's own workers.

sac-policy refused images ("use actor-critic (PPO)"), so a continuous-control task seen through
a camera could only be learned on-policy.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from algorithm.sac.pixels import random_shift, shift_images
from algorithm.sac.policy import SACPolicy
from algorithm.sac.trainer import SACTrainer
from api.namedarray import NamedArray
from api.policy import RolloutRequest
from api.replay import TransitionBatch

IMAGE = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
ACTION = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
ROWS = 32


def _images(rng: np.random.Generator, rows: int = ROWS) -> np.ndarray:
    return rng.integers(0, 256, (rows, *IMAGE.shape), dtype=np.uint8)


def _batch(rng: np.random.Generator, obs=None, next_obs=None) -> TransitionBatch:
    return TransitionBatch(
        obs=_images(rng) if obs is None else obs,
        next_obs=_images(rng) if next_obs is None else next_obs,
        action=rng.uniform(-2, 2, (ROWS, 2)).astype(np.float32),
        reward=rng.normal(size=(ROWS, 1)).astype(np.float32),
        discount=np.full((ROWS, 1), 0.99, np.float32),
    )


def _policy(space: gym.Space = IMAGE, **kwargs) -> SACPolicy:
    return SACPolicy(space, ACTION, hidden_sizes=(32, 32), feature_dim=16, seed=0, **kwargs)


def test_a_shift_moves_each_image_by_at_most_pad_pixels_with_the_edge_repeated():
    images = torch.zeros(200, 1, 11, 11, dtype=torch.uint8)
    images[:, 0, 5, 5] = 255  # a dot in the middle
    shifted = random_shift(images, 3, True, torch.Generator().manual_seed(0))
    assert shifted.dtype == torch.uint8 and shifted.shape == images.shape
    assert (shifted == 255).sum(dim=(1, 2, 3)).eq(1).all()  # the dot, moved, never lost
    rows, cols = (shifted[:, 0] == 255).nonzero()[:, 1:].T
    assert rows.sub(5).abs().max() == 3 and cols.sub(5).abs().max() == 3
    assert len({(int(r), int(c)) for r, c in zip(rows, cols, strict=True)}) > 30  # each its own
    # each is a crop of the image padded with its edge repeated, at an offset of its own
    noise = torch.randint(0, 256, (40, 2, 8, 8), dtype=torch.uint8)
    out = random_shift(noise, 2, True, torch.Generator().manual_seed(1))
    padded = torch.nn.functional.pad(noise.float(), (2, 2, 2, 2), mode="replicate")
    crops = [padded[:, :, dy : dy + 8, dx : dx + 8] for dy in range(5) for dx in range(5)]
    found = torch.stack([(out.float() == c).flatten(1).all(1) for c in crops], 1)  # [40, 25]
    assert found.sum(1).eq(1).all()
    assert len(set(found.int().argmax(1).tolist())) > 10


def test_both_layouts_and_a_dict_shift_alike():
    rng = np.random.default_rng(0)
    last = torch.as_tensor(_images(rng, 20))
    by_first = random_shift(last.permute(0, 3, 1, 2), 4, True, torch.Generator().manual_seed(2))
    by_last = random_shift(last, 4, False, torch.Generator().manual_seed(2))
    torch.testing.assert_close(by_last, by_first.permute(0, 2, 3, 1))
    space = gym.spaces.Dict({"camera": IMAGE, "speed": gym.spaces.Box(-1, 1, (1,), np.float32)})
    speed = torch.rand(20, 1)
    obs = shift_images(
        NamedArray(camera=last, speed=speed), space, 4, torch.Generator().manual_seed(2)
    )
    torch.testing.assert_close(obs.camera, by_last)
    assert obs.speed is speed
    assert shift_images(last, IMAGE, 0, torch.Generator()) is last  # shift_pad=0: no shifts


def test_the_encoder_learns_from_the_critics_loss_alone():
    policy = _policy()
    out = policy.analyze(_batch(np.random.default_rng(0)))
    encoder = list(policy.module.features.parameters())
    assert encoder and all(p.requires_grad for p in encoder)
    actor_loss = (0.1 * out.log_prob - out.q_new).mean()
    actor_loss.backward(retain_graph=True)
    assert all(p.grad is None for p in encoder)  # the actor reads the features detached
    assert any(p.grad is not None for p in policy.actor_parameters())
    ((out.q1 - 1.0).pow(2) + (out.q2 - 1.0).pow(2)).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in encoder)
    assert {id(p) for p in encoder} <= {id(p) for p in policy.critic_parameters()}
    assert not {id(p) for p in encoder} & {id(p) for p in policy.actor_parameters()}


def test_a_trainer_step_trains_the_encoder_and_moves_its_target_by_tau():
    policy = _policy()
    module = policy.module
    torch.testing.assert_close(
        module.features_target.state_dict(), module.features.state_dict()
    )  # the target starts as a copy
    before = {k: v.clone() for k, v in module.features.state_dict().items()}
    trainer = SACTrainer(policy, tau=0.25)
    stats = trainer.step(_batch(np.random.default_rng(1))).stats
    assert np.isfinite(list(stats.values())).all()
    after, target = module.features.state_dict(), module.features_target.state_dict()
    weight = "read.parts.obs.net.0.weight"
    assert not torch.equal(after[weight], before[weight])
    torch.testing.assert_close(target[weight], 0.75 * before[weight] + 0.25 * after[weight])


def test_actions_from_images_stay_in_the_box_and_replay_from_a_checkpoint():
    rng = np.random.default_rng(2)
    obs = _images(rng)
    request = RolloutRequest(obs=obs, is_evaluation=np.ones((ROWS, 1), bool))
    policy = _policy()
    SACTrainer(policy).step(_batch(rng))
    greedy = policy.rollout(request).action
    assert greedy.shape == (ROWS, 2) and greedy.dtype == np.float32
    assert np.all(np.abs(greedy) <= 2.0)
    explore = policy.rollout(RolloutRequest(obs=obs, is_evaluation=np.zeros((ROWS, 1), bool)))
    assert not np.allclose(explore.action, greedy)
    fresh = SACPolicy(IMAGE, ACTION, hidden_sizes=(32, 32), feature_dim=16, seed=9)
    fresh.load_checkpoint(policy.get_checkpoint())
    np.testing.assert_array_equal(fresh.rollout(request).action, greedy)
    torch.testing.assert_close(
        fresh.module.features_target.state_dict(), policy.module.features_target.state_dict()
    )


def test_a_dict_of_a_camera_and_a_vector_is_read_whole():
    space = gym.spaces.Dict({"camera": IMAGE, "speed": gym.spaces.Box(-1, 1, (2,), np.float32)})
    policy = _policy(space)
    rng = np.random.default_rng(3)

    def obs():
        return NamedArray(camera=_images(rng), speed=rng.uniform(-1, 1, (ROWS, 2)))

    out = policy.analyze(_batch(rng, obs(), obs()))
    assert out.q1.shape == (ROWS, 1) and torch.isfinite(out.next_q_target).all()
    first = obs()
    evaluation = np.ones((ROWS, 1), bool)
    action = policy.rollout(RolloutRequest(obs=first, is_evaluation=evaluation)).action
    first.speed = -first.speed  # the vector part is read too
    other = policy.rollout(RolloutRequest(obs=first, is_evaluation=evaluation)).action
    assert not np.allclose(action, other)


def test_a_vector_policy_has_no_encoder_weights_so_its_checkpoints_stay_as_they_were():
    vector = SACPolicy(gym.spaces.Box(-1, 1, (3,), np.float32), ACTION, seed=0)
    keys = list(vector.module.state_dict())
    assert not [k for k in keys if k.startswith("features")], keys
    assert vector.shift_pad == 0


@pytest.mark.parametrize("bad", [{"feature_dim": 0}, {"shift_pad": -1}])
def test_the_pixel_arguments_are_range_checked(bad):
    from api.config.arguments import argument_range_errors

    errors = argument_range_errors(SACPolicy.arg_ranges, bad, "policy")
    assert len(errors) == 1 and f"policy.args.{next(iter(bad))}" in errors[0], errors


def test_the_pipeline_trains_sac_on_an_image_task():
    import dot_offset  # noqa: F401  (registers DotOffset-v0)

    from api.testing import test_pipeline

    report = test_pipeline("DotOffset-v0", algo="sac")
    assert report.trainers == {"default": "sac"} and report.trainer_steps["default"] >= 3
    assert report.batch_shapes["default"]["obs"] == (128, 20, 20, 3)  # images, replayed
    versions = report.versions["default"]
    assert f"versions {versions[0]} to {versions[-1]}\n" in str(report)  # not every one
