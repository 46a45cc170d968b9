"""The entry points: `tokenrl-train`, `tokenrl-eval`, `tokenrl-export`, `tokenrl-doctor` (the root `train.py` and
`eval.py` call them) and the one-line report of a user's error they share."""
