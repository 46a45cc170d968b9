"""The records one layer hands another (docs/architecture.md): a step's prompts, a rollout batch, per-token
statistics, a selection, a micro-batch's loss inputs, a problem, the rules of a setting. Plain dataclasses over tensors,
importing nothing of tokenrl, so that every package can sit above them."""
