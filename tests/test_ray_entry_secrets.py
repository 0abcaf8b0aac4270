"""The Ray job's entrypoint keeps its engine to itself: the engine listens on the node's own
address (never every interface), and its environment (HF_TOKEN) comes from a file the
runtime wrote for it, read once and removed, never from the job's submission."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import TYPE_CHECKING

from deployments.engines.ray_entry import HOST_LINE, PORT_LINE
from tests.test_ray_entry import ENGINE, engine_dies_with, engine_pid

if TYPE_CHECKING:
    from pathlib import Path

ENTRY = [sys.executable, "-m", "deployments.engines.ray_entry"]
# An engine that says what it was given: the address and port, and its environment's token.
TELLER = [
    sys.executable,
    "-c",
    "import os, sys; print('engine', sys.argv[1], os.environ.get('HF_TOKEN'), flush=True)",
    "{host}:{port}",
]


def said(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)


def test_it_binds_the_engine_to_the_address_this_node_has_of_the_cluster_s(
    tmp_path: Path,
) -> None:
    # 203.0.113.9 (TEST-NET-3) is another node's: it cannot be bound here.
    proc = subprocess.Popen(
        [*ENTRY, "--node-ips", "203.0.113.9,127.0.0.1", "--", *ENGINE],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().removeprefix(PORT_LINE))
        assert proc.stdout.readline().strip() == f"{HOST_LINE}127.0.0.1"
        pid = engine_pid(port)  # it answers on 127.0.0.1...
        with socket.socket() as probe:  # ...and on that address alone (0.0.0.0 would take it)
            assert probe.connect_ex(("127.0.0.2", port)) != 0
        assert engine_dies_with(proc, pid, port)
    finally:
        proc.kill()
        proc.wait()


def test_it_never_binds_every_interface_when_told_nothing() -> None:
    done = subprocess.run([*ENTRY, "--", *TELLER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    host = said(done.stdout)[HOST_LINE.strip(": ")]
    assert host == "127.0.0.1"
    assert f"engine 127.0.0.1:{said(done.stdout)[PORT_LINE.strip(': ')]} None" in done.stdout


def test_it_gives_the_engine_the_environment_of_its_file_and_removes_the_file(
    tmp_path: Path,
) -> None:
    env_file = tmp_path / "job.json"
    env_file.write_text(json.dumps({"HF_TOKEN": "hf_not_in_the_submission"}))
    env_file.chmod(0o600)
    command = [*ENTRY, "--env-file", str(env_file), "--", *TELLER]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "hf_not_in_the_submission" in done.stdout  # the engine has it...
    assert "hf_not_in_the_submission" not in " ".join(command)  # ...the job's entrypoint not
    assert not env_file.exists()  # read once: a later reader of the folder finds nothing


def test_it_refuses_an_environment_it_cannot_read_without_showing_it(tmp_path: Path) -> None:
    env_file = tmp_path / "job.json"
    env_file.write_text('{"HF_TOKEN": "hf_half')
    done = subprocess.run(
        [*ENTRY, "--env-file", str(env_file), "--", *TELLER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 126
    assert f"the engine's environment {env_file} cannot be read" in done.stderr
    assert "hf_half" not in done.stderr + done.stdout
    assert done.stdout == ""  # no port, no engine
    missing = subprocess.run(
        [*ENTRY, "--env-file", str(tmp_path / "gone.json"), "--", *TELLER],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 126 and "gone.json cannot be read" in missing.stderr
    assert os.listdir(tmp_path) == ["job.json"]
