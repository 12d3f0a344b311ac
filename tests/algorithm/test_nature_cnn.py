"""Image encoders: the Nature CNN for Atari-sized frames, the small CNN below 36x36."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from algorithm.actor_critic_policies.policy import ActorCriticPolicy
from algorithm.modules.encoders import CNNEncoder, NatureCNN, ObservationEncoder, image_encoder
from api.policy import RolloutRequest

ATARI = gym.spaces.Box(0, 255, shape=(4, 84, 84), dtype=np.uint8)


def test_nature_cnn_layers_and_output_shape():
    cnn = NatureCNN((4, 84, 84))
    convs = [m for m in cnn.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)),
        (64, (4, 4), (2, 2)),
        (64, (3, 3), (1, 1)),
    ]
    linear = [m for m in cnn.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linear] == [(3136, 512)]
    frames = torch.randint(0, 256, (2, 3, 4, 84, 84), dtype=torch.uint8)  # [T, B, C, H, W]
    assert cnn(frames).shape == (2, 3, 512) and cnn.out_features == 512


def test_channel_last_images_give_the_same_features_as_channel_first():
    torch.manual_seed(0)
    first = NatureCNN((4, 84, 84))
    last = NatureCNN((84, 84, 4))
    last.load_state_dict(first.state_dict())
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(last(frames.permute(0, 2, 3, 1)), first(frames))


def test_inputs_are_scaled_by_1_over_255_inside_the_model():
    cnn = NatureCNN((4, 84, 84))
    frames = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(cnn(frames), cnn.net(frames.float() / 255.0))


def test_training_on_the_cpu_gives_the_features_and_gradients_of_inference():
    """With autograd on, the CPU path feeds the convolutions channels-last inputs (faster
    gradients): the features must be inference's, and the gradients those of the plain
    layout, up to float rounding; the parameters keep their layout."""
    torch.manual_seed(0)
    cnn = NatureCNN((4, 84, 84))
    frames = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        inferred = cnn(frames)
    trained = cnn(frames)
    torch.testing.assert_close(trained, inferred)
    trained.square().sum().backward()
    ours = [p.grad.clone() for p in cnn.parameters()]
    cnn.zero_grad()
    cnn.net(frames.float() / 255.0).square().sum().backward()  # the plain NCHW layout
    for got, want in zip(ours, [p.grad for p in cnn.parameters()]):
        scale = want.abs().max().item()  # summed in another order: compare to the largest
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * scale)
    assert all(p.is_contiguous() for p in cnn.parameters())


def test_atari_frames_get_the_nature_cnn_and_small_images_the_small_one():
    assert isinstance(image_encoder((4, 84, 84)), NatureCNN)
    assert isinstance(image_encoder((84, 84, 3)), NatureCNN)
    assert isinstance(image_encoder((10, 10, 3)), CNNEncoder)
    assert isinstance(image_encoder((4, 20, 20)), CNNEncoder)
    encoder = ObservationEncoder(ATARI, hidden_sizes=[])
    assert isinstance(encoder.parts["obs"], NatureCNN) and encoder.out_features == 512


def test_atari_policy_acts_through_torch_not_the_numpy_copy():
    """The numpy fast path copies MLPs only; an image policy must not take it."""
    policy = ActorCriticPolicy(ATARI, gym.spaces.Discrete(6), hidden_sizes=[], seed=0)
    assert policy._numpy is None
    obs = np.random.default_rng(0).integers(0, 256, (3, 4, 84, 84), dtype=np.uint8)
    result = policy.rollout(RolloutRequest(obs=obs, on_reset=np.ones((3, 1), bool)))
    assert result.action.shape == (3,) and result.policy_output.value.shape == (3, 1)
