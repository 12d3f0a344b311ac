"""What ``troupe run`` and ``troupe train`` print as a run starts, beside its folder: the rule
that stops it, and which policy plays which agents where several do."""

from __future__ import annotations

from api.config import StopConfig


def seats_line(agent_policies: list[str]) -> str | None:
    """``policies: adversary plays agents 0 and 1, agent plays agent 2``, where agents play
    several policies (``troupe train`` gives a policy to each kind of agent): the metrics and
    the panel name the policies, and this says whose they are. None where one policy plays."""
    if len(set(agent_policies)) < 2:
        return None
    said = []
    for name in dict.fromkeys(agent_policies):
        agents = [str(i) for i, n in enumerate(agent_policies) if n == name]
        whom = f"agents {', '.join(agents[:-1])} and {agents[-1]}"
        if len(agents) == 1:
            whom = f"agent {agents[0]}"
        said.append(f"{name} plays {whom}")
    return "policies: " + ", ".join(said)


def stop_rule(stop: StopConfig, pbt_target: float | None = None) -> str:
    """``stop at: greedy evaluation return 475 (gymnasium's reward_threshold for CartPole-v1),
    or 1000000 env frames``: every stop rule in force (a PBT population's target too), and
    where the evaluation target came from if known."""
    source = f" ({stop.target_source})" if stop.target_source else ""
    if stop.eval_return is not None:
        rules = [f"greedy evaluation return {stop.eval_return:g}{source}"]
    else:
        rules = [f"no evaluation target{source}"] if source else []
    if pbt_target is not None:
        rules.append(f"a PBT member's score {pbt_target:g}")
    rules += [
        f"{value:g} {unit}" if isinstance(value, float) else f"{value} {unit}"
        for value, unit in ((stop.env_frames, "env frames"), (stop.trainer_steps, "trainer steps"),
                            (stop.wall_seconds, "seconds"))
        if value is not None
    ]  # fmt: skip
    return "stop at: " + ", or ".join(rules)
