"""The entry points (`tokenrl-train`, `-eval`, `-export`, `-doctor`) and the one-line report of a user's error."""
