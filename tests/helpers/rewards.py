"""Verifiers for tests, referenced as `tests.helpers.rewards:<name>`."""

import time


def length_reward(response: str, answer: str) -> float:
    """Reward long responses: varies within a group, so advantages are non-zero for a random model."""
    return min(len(response), 12) / 12.0


def parity_reward(response: str, answer: str) -> float:
    """1 when the response starts with an even character code: a random model's group almost always mixes both, at
    any response length (`length_reward` saturates past 12 characters)."""
    return float(bool(response) and ord(response[0]) % 2 == 0)


def raising(response: str, answer: str) -> float:
    raise RuntimeError("this verifier always fails")


def hanging(response: str, answer: str) -> float:
    if "hang" in response:
        time.sleep(3600)
    return 1.0


def odd_answers_unsolvable(response: str, answer: str) -> float:
    """0 for every response to an odd answer (a group dynamic sampling must drop); otherwise 1 when the response
    starts with an even character code, which a random model's group almost always mixes."""
    if int(answer) % 2:
        return 0.0
    return float(bool(response) and ord(response[0]) % 2 == 0)


def busy(response: str, answer: str) -> float:
    """1 after `response` seconds of CPU time in this process (a check that needs the CPU, not just wall time)."""
    end = time.process_time() + float(response)
    while time.process_time() < end:
        pass
    return 1.0
