"""The records every layer shares (docs/architecture.md): a rollout batch, per-token statistics, a selection, a
problem. Plain dataclasses over tensors, importing nothing of tokenrl, so that every package can sit above them."""
