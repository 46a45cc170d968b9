"""utils.py: derived seeds, RNG states that round-trip, and the global state kept across a library call."""

import random

import numpy as np
import torch

from tokenrl.utils import derived_seed, global_state_kept, restore_rng_state, rng_state


def test_global_state_kept_undoes_what_the_block_changes():
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    precision, threads = torch.get_float32_matmul_precision(), torch.get_num_threads()
    with global_state_kept():  # what vLLM's start does
        torch.manual_seed(0), np.random.seed(0), random.seed(0)
        torch.set_float32_matmul_precision("medium" if precision != "medium" else "high")
        torch.set_num_threads(max(1, threads - 1) if threads > 1 else 2)
    drawn = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(drawn[0], expected[0]) and np.array_equal(drawn[1], expected[1]) and drawn[2] == expected[2]
    assert torch.get_float32_matmul_precision() == precision and torch.get_num_threads() == threads


def test_derived_seeds_are_stable_and_distinct():
    assert derived_seed(0, "shuffle", 3) == derived_seed(0, "shuffle", 3) != derived_seed(0, "shuffle", 4)
    assert 0 <= derived_seed("x") < 2**31


def test_rng_states_round_trip():
    state = rng_state()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng_state(state)
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]
