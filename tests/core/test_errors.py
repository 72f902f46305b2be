"""``dare_core.errors.run_script``: how the repository's scripts end."""

import pytest

from dare_core.errors import DareError, run_script


def _raises() -> int:
    raise DareError("checkpoint directory 'x' does not exist; pass a directory or 'bundled'")


def test_user_error_is_one_line_and_status_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_script(_raises)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: checkpoint directory 'x' does not exist; pass a directory or 'bundled'\n"


def test_status_of_main_is_the_exit_status():
    for status in (0, 3):
        with pytest.raises(SystemExit) as exit_info:
            run_script(lambda: status)
        assert exit_info.value.code == status


def test_other_exceptions_keep_their_traceback():
    with pytest.raises(ZeroDivisionError):
        run_script(lambda: 1 // 0)
