"""tokenrl: token-selective reinforcement learning (GRPO with ICT, 20-Entropy, STAPO, uniform, random)."""

__version__ = "0.1.0"
