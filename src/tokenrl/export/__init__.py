"""The trained policy as a Hugging Face folder (`<run>/model/`, `tokenrl-export`)."""
