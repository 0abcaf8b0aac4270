"""The on-demand key file: rotation with its grace for the previous key, a missing file said
once, on a clock the test moves."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from ondemand.guard import PREVIOUS_KEY_GRACE_S, FailedAttempts, KeyFile, check_key
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from pathlib import Path


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def refused(keyfile: KeyFile, failures: FailedAttempts, key: bytes) -> tuple[int, str]:
    with pytest.raises(GatewayError) as failure:
        check_key(keyfile, failures, "10.0.0.9", key)
    return failure.value.status, failure.value.code


def test_it_lets_the_previous_key_through_as_401_for_300_s_without_counting_it(
    tmp_path: Path,
) -> None:
    clock = Clock()
    path = tmp_path / "key"
    path.write_text("odk-first\n")
    keyfile, failures = KeyFile(lambda: path, clock), FailedAttempts(clock)
    check_key(keyfile, failures, "10.0.0.9", b"odk-first")
    path.write_text("odk-second-longer\n")  # rotated (another size: a new stamp)
    clock.t += 1.0
    check_key(keyfile, failures, "10.0.0.9", b"odk-second-longer")
    for _ in range(20):  # LiteLLM keeps sending the old key until it reloads its entries
        assert refused(keyfile, failures, b"odk-first")[0] == 401
    assert failures.windows == {}  # none of it counted as a failed attempt
    clock.t += PREVIOUS_KEY_GRACE_S
    assert not keyfile.is_previous(b"odk-first")
    assert refused(keyfile, failures, b"odk-first")[0] == 401
    assert failures.windows["10.0.0.9"][1] == 1  # after the grace, it is a wrong key


def test_it_says_once_that_the_key_file_is_missing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    path = tmp_path / "key"
    keyfile, failures = KeyFile(lambda: path, clock), FailedAttempts(clock)
    with caplog.at_level(logging.ERROR, logger="ondemand.guard"):
        for _ in range(5):
            clock.t += 1.0
            assert refused(keyfile, failures, b"odk-x") == (503, "ondemand_not_configured")
        assert len([r for r in caplog.records if "is missing or empty" in r.message]) == 1
        path.write_text("odk-back\n")
        clock.t += 1.0
        check_key(keyfile, failures, "10.0.0.9", b"odk-back")
        path.unlink()
        clock.t += 1.0
        assert refused(keyfile, failures, b"odk-back")[0] == 503
    # Gone again after it was back: said again, once.
    assert len([r for r in caplog.records if "is missing or empty" in r.message]) == 2
