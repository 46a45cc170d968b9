"""Answer verifiers and their time-limited, never-executing runner. Importing this package does not import torch."""
