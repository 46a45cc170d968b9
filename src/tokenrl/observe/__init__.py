"""What a step shows besides its loss: selection diagnostics against the true forks, and the samples a run writes."""
