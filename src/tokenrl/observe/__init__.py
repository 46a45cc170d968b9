"""What a step shows besides its loss: the selection's diagnostics against the true forks, and the samples a run
writes."""
