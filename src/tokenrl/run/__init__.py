"""A training run under Lightning: the `GRPOModule` and its resumable state, the update under Lightning's
strategies, checkpoints, preemption and resume, progress, the memory plan, devices and the allocator; `training.py`
puts one run together from its config."""
