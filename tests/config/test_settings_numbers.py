"""A number in the environment is a number in its range, or the process stops at its start naming
the variable: `1e12` seconds of a request's time to live made every ask a server error."""

import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from config.settings import TEN_YEARS_S, env_number
from tests.support import BASE_DIR, child_env


@pytest.mark.parametrize(
    ("raw", "whole", "read"),
    [
        (None, False, 60.0),
        ("2.5", False, 2.5),
        ("0", True, 0),
        (None, True, 8),
        (str(TEN_YEARS_S), False, TEN_YEARS_S),
        ("1073741824", True, 1073741824),  # a count or a size has no bound above (a GiB of artifact)
    ],
)
def test_a_number_in_its_range_is_read(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, whole: bool, read: float
) -> None:
    if raw is not None:
        monkeypatch.setenv("AGORA_TEST_NUMBER", raw)
    default = 8 if whole else 60

    value = env_number("AGORA_TEST_NUMBER", default, whole=whole)

    assert value == read and type(value) is (int if whole else float)


@pytest.mark.parametrize(
    ("raw", "whole", "message"),
    [
        ("abc", False, "AGORA_TEST_NUMBER is a number, not 'abc'."),
        ("2.5", True, "AGORA_TEST_NUMBER is a whole number, not '2.5'."),
        ("-1", False, "AGORA_TEST_NUMBER is from 0 to 3.1536e+08, not '-1'."),
        ("-1", True, "AGORA_TEST_NUMBER is from 0 up, not '-1'."),
        ("1e12", False, "AGORA_TEST_NUMBER is from 0 to 3.1536e+08, not '1e12'."),
        ("nan", False, "AGORA_TEST_NUMBER is from 0 to 3.1536e+08, not 'nan'."),
        ("inf", False, "AGORA_TEST_NUMBER is from 0 to 3.1536e+08, not 'inf'."),
    ],
)
def test_anything_else_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, raw: str, whole: bool, message: str) -> None:
    monkeypatch.setenv("AGORA_TEST_NUMBER", raw)

    with pytest.raises(ImproperlyConfigured) as refused:
        env_number("AGORA_TEST_NUMBER", 1, whole=whole)

    assert str(refused.value) == message


def test_a_process_with_a_bad_number_stops_at_its_start(redis_url: str) -> None:
    started = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=BASE_DIR, env=child_env(redis_url, AGORA_REQUEST_TTL_S="1e12"),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert started.returncode != 0
    assert "ImproperlyConfigured: AGORA_REQUEST_TTL_S is from 0 to 3.1536e+08, not '1e12'." in started.stderr
