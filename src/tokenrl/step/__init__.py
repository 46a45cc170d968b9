"""One training step put together (docs/architecture.md): the train batch, the PPO update loop over mini- and
micro-batches, the policy's forward passes, the fast path, the entropy coefficient and lr schedules, metrics."""
