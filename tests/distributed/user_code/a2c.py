import dataclasses

import torch

import troupe
from algorithm.modules.gae import gae_advantages
from api.testing import test_pipeline
from api.trainer import Trainer, TrainerStepResult, register


class A2C(Trainer):
    """Advantage actor-critic: one gradient step per batch, on n-step returns."""

    @dataclasses.dataclass
    class AnalyzedResult:  # what this trainer needs from policy.analyze, each [T, B, 1]
        new_log_prob: torch.Tensor
        entropy: torch.Tensor
        value: torch.Tensor

    analyze_target = "impala"  # the actor-critic policy's result for it holds these fields
    arg_ranges = {"lr": "(0, inf)", "gamma": "[0, 1]", "entropy_coef": "[0, inf)"}

    def __init__(self, policy, lr: float = 1e-3, gamma: float = 0.99, entropy_coef: float = 0.01):
        self._policy = policy
        self.lr, self.gamma, self.entropy_coef = lr, gamma, entropy_coef
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
        self.steps = 0

    @property
    def policy(self):
        return self._policy

    def step(self, samples):
        self.policy.train_mode()
        out = self.policy.analyze(samples, target=self.analyze_target)
        device = out.value.device
        reward = torch.as_tensor(samples.reward, device=device).float()
        done = torch.as_tensor(samples.done, device=device)
        truncated = torch.as_tensor(samples.truncated, device=device)
        advantages, returns, mask = gae_advantages(
            reward, out.value.detach(), done, truncated, self.gamma, gae_lambda=1.0
        )
        valid = mask.bool()  # the last step of a segment and finished steps are not trained on
        policy_loss = -(out.new_log_prob * advantages)[valid].mean()
        value_loss = (out.value - returns)[valid].pow(2).mean()
        entropy = out.entropy[valid].mean()
        loss = policy_loss + 0.5 * value_loss - self.entropy_coef * entropy
        for group in self.optimizer.param_groups:  # PBT may change self.lr between steps
            group["lr"] = self.lr
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.policy.inc_version()  # new parameters, a new version: the runtime publishes it
        self.steps += 1
        stats = {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}
        return TrainerStepResult({k: v.item() for k, v in stats.items()}, step=self.steps)

    def get_checkpoint(self):
        # saved with every persisted version; given back on --resume and after a restart
        return {"optimizer": self.optimizer.state_dict(), "steps": self.steps}

    def load_checkpoint(self, checkpoint):
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.steps = checkpoint["steps"]


if __name__ == "__main__":
    register("a2c", A2C)
    print(test_pipeline("CartPole-v1", "actor-critic", "a2c"))
    a2c = ["policies.default.trainer.type=a2c", "policies.default.trainer.args={}"]
    result = troupe.train("cartpole-ppo", [*a2c, "stop.env_frames=300000"])
    print(result.summary["stop_reason"], result.summary["best_eval_return"], result.run_dir)
