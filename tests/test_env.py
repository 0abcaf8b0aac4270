"""Settings from the environment are parsed strictly: a wrong value names its variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from common.env import (
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_path,
    env_str,
)
from common.networks import networks
from tests.conftest import REPO


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("true", True),
        ("ON", True),
        ("1", True),
        ("yes", True),
        ("false", False),
        ("off", False),
        ("0", False),
        ("No", False),
        ("", True),
        (" ", True),
    ],
)
def test_it_reads_booleans(monkeypatch: pytest.MonkeyPatch, value: str, expected: bool) -> None:
    monkeypatch.setenv("MSHIP_X", value)
    assert env_bool("MSHIP_X", True) is expected


@pytest.mark.parametrize("value", ["flase", "2", "enabled", "y"])
def test_it_refuses_a_boolean_it_does_not_know(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MSHIP_X", value)
    with pytest.raises(ImproperlyConfigured, match="MSHIP_X must be true or false"):
        env_bool("MSHIP_X", False)


def test_it_reads_numbers_lists_and_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (
        ("MSHIP_I", "16e6"),
        ("MSHIP_F", "0.5"),
        ("MSHIP_L", " a, b ,,c"),
        ("MSHIP_P", "/srv/x"),
        ("MSHIP_S", " kept "),
    ):
        monkeypatch.setenv(name, value)
    assert env_int("MSHIP_I", 1) == 16_000_000
    assert env_float("MSHIP_F", 1.0) == 0.5
    assert env_list("MSHIP_L", []) == ["a", "b", "c"]
    assert env_path("MSHIP_P", "/tmp") == Path("/srv/x")
    assert env_path("MSHIP_UNSET_PATH", "/tmp") == Path("/tmp")
    assert env_str("MSHIP_S", "") == " kept "
    assert env_int("MSHIP_UNSET_INT", 7) == 7


@pytest.mark.parametrize(
    ("reader", "value", "message"),
    [
        (env_int, "1.5", "must be a whole number"),
        (env_int, "ten", "must be a number"),
        (env_float, "nan", "must be a finite number"),
        (env_float, "inf", "must be a finite number"),
        (env_float, "1,5", "must be a number"),
    ],
)
def test_it_refuses_a_number_that_is_not_one(
    monkeypatch: pytest.MonkeyPatch, reader: object, value: str, message: str
) -> None:
    monkeypatch.setenv("MSHIP_N", value)
    with pytest.raises(ImproperlyConfigured, match=f"MSHIP_N {message}"):
        reader("MSHIP_N", 1)  # type: ignore[operator]


def test_it_checks_a_list_of_networks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSHIP_NETS", "10.0.0.0/8, 127.0.0.1,::1")
    assert env_networks("MSHIP_NETS", []) == ["10.0.0.0/8", "127.0.0.1", "::1"]
    monkeypatch.setenv("MSHIP_NETS", "10.0.0.0/8,proxy.local")
    with pytest.raises(ImproperlyConfigured, match="MSHIP_NETS must list addresses"):
        env_networks("MSHIP_NETS", [])


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("MSHIP_AUTH", "flase", "MSHIP_AUTH must be true or false"),
        ("MSHIP_GPU_INVENTORY", "80,80GB", "MSHIP_GPU_INVENTORY must list each GPU's memory"),
    ],
)
def test_it_stops_the_site_on_a_bad_setting_with_the_variables_name(
    name: str, value: str, message: str
) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "modelship_site.settings", name: value}
    done = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert message in done.stderr


def test_it_reads_networks_one_way_for_every_list() -> None:
    assert [str(n) for n in networks(["10.0.0.0/8", " 127.0.0.1", "[::1]", ""])] == [
        "10.0.0.0/8",
        "127.0.0.1/32",
        "::1/128",
    ]
    with pytest.raises(ValueError):
        networks(["10.0.0.0/8", "mcp.example.com"])
    assert [str(n) for n in networks(["mcp.example.com", "192.168.1.0/24"], skip_names=True)] == [
        "192.168.1.0/24"
    ]


def test_it_takes_only_a_known_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSHIP_STRATEGY", "stop_start")
    assert env_choice("MSHIP_STRATEGY", "blue_green", ("blue_green", "stop_start")) == "stop_start"
    monkeypatch.setenv("MSHIP_STRATEGY", "")
    assert env_choice("MSHIP_STRATEGY", "blue_green", ("blue_green", "stop_start")) == "blue_green"
    monkeypatch.setenv("MSHIP_STRATEGY", "green_blue")
    with pytest.raises(ImproperlyConfigured, match="MSHIP_STRATEGY must be one of"):
        env_choice("MSHIP_STRATEGY", "blue_green", ("blue_green", "stop_start"))
