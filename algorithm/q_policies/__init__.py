"""Q-network policies (DQN)."""
