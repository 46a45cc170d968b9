"""during_training.py: the console line of a validation."""

from tokenrl.evaluation.during_training import PeriodicValidation


def test_the_validation_line_names_the_step_and_every_pass_at_k():
    metrics = {
        "val/pass@1": 0.1641,
        "val/pass@4": 0.53125,
        "val/avg@4": 0.16,
        "val/math500/pass@1": 0.25,
        "val/at_step": 10.0,
        "time/validate": 12.34,
    }
    assert PeriodicValidation.line(metrics) == (
        "validation at step 10 | pass@1 0.164 | pass@4 0.531 | math500/pass@1 0.250 | 12.3 s"
    )
