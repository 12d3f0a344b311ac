"""DQN: double, n-step, dueling Q-learning from replayed transitions."""
