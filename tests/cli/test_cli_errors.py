"""The entry points' one-line report of a user's error, and the message of a checkpoint of another model."""

from __future__ import annotations

import logging

import pytest

from tokenrl.cli.errors import DEBUG_ENV, report_user_error
from tokenrl.run.checkpointing import checkpoint_mismatch


def test_a_user_error_is_one_error_line_on_the_console_and_its_traceback_in_the_log_file(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    handler = logging.FileHandler(tmp_path / "run.log")
    logging.getLogger().addHandler(handler)
    try:
        try:
            raise ValueError("total_steps=-1: must be an integer >= 1")
        except ValueError as err:
            report_user_error(err)
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
    err = capsys.readouterr().err
    assert err.startswith("error: total_steps=-1: must be an integer >= 1\n") and "Traceback" not in err
    assert err.splitlines()[1].startswith("(the traceback is in ") and f"; {DEBUG_ENV}=1 prints it here)" in err
    assert "Traceback" in (tmp_path / "run.log").read_text()


def test_tokenrl_debug_prints_the_traceback_too(capsys, monkeypatch):
    monkeypatch.setenv(DEBUG_ENV, "1")
    try:
        raise FileNotFoundError("ckpt_path=/no/such.ckpt: no such file")
    except FileNotFoundError as err:
        report_user_error(err)
    err = capsys.readouterr().err
    assert err.startswith("error: ckpt_path=/no/such.ckpt: no such file\n") and "Traceback" in err


SHAPES = {"embed.weight": [128, 64], "norm.weight": [64], "lora_A": [8, 64]}


@pytest.mark.parametrize(
    "saved,complete,message",
    [
        (SHAPES, True, None),
        (
            {"embed.weight": [128, 128], "norm.weight": [128], "lora_A": [8, 64]},
            True,
            "2 of 3 weights differ in shape, e.g. `embed.weight` [128, 128] in the checkpoint vs [128, 64] here",
        ),
        (
            {"embed.weight": [128, 64], "norm.weight": [64]},
            True,
            "1 of 3 weights differ in shape, e.g. `lora_A` absent in the checkpoint vs [8, 64] here",
        ),
        ({"lora_A": [8, 64]}, False, None),  # adapters alone: the base's weights are not compared
        (
            {"lora_A": [16, 64], "extra": [1]},
            False,
            "2 of 2 weights differ in shape, e.g. `extra` [1] in the checkpoint vs absent here",
        ),
    ],
)
def test_a_checkpoint_of_another_model_is_named_with_how_many_weights_differ(saved, complete, message):
    error = checkpoint_mismatch("run/last.ckpt", saved, SHAPES, "use its model", complete)
    if message is None:
        assert error is None
    else:
        assert str(error) == f"ckpt_path=run/last.ckpt: a checkpoint of another model ({message}): use its model"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--only", "gpu"], "argument --only: invalid choice: 'gpu'"),
        (["--timeout", "soon"], "argument --timeout: invalid float value: 'soon'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_a_bad_doctor_command_line_is_one_error_line(argv, message, capsys):
    from tokenrl.cli.doctor import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: tokenrl-doctor: ") and message in err and "tokenrl-doctor --help" in err


def test_the_doctor_refuses_a_report_it_cannot_write_before_any_check(tmp_path, capsys, monkeypatch):
    import tokenrl.cli.doctor as doctor

    monkeypatch.setattr(
        "tokenrl.run.machine_check.environment", lambda: pytest.fail("a check ran before --out was checked")
    )
    (tmp_path / "a_file").write_text("")
    for out, reason in ((tmp_path, "is a folder"), (tmp_path / "a_file" / "doctor.json", "cannot create its folder")):
        with pytest.raises(SystemExit) as stop:
            doctor.main(["--out", str(out)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and f"--out {out}" in err and reason in err
