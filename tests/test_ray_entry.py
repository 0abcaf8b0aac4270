"""The Ray job's entrypoint: it picks the engine's port, reports it, and never leaves the
engine behind (a job stop, an orphaned job)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from deployments.engines.ray_entry import PORT_LINE
from deployments.runtimes.process import proc_stat

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import IO

ENTRY = [sys.executable, "-m", "deployments.engines.ray_entry", "--bind", "127.0.0.1"]
ENGINE = [
    *(sys.executable, "-m", "deployments.engines.simulated", "--model", "m"),
    *("--host", "{host}", "--port", "{port}"),
]


def port_of(stdout: IO[str] | None) -> int:
    assert stdout is not None
    line = stdout.readline()
    assert line.startswith(PORT_LINE), line
    return int(line[len(PORT_LINE) :])


def engine_pid(port: int) -> int:
    """The engine's pid, once it answers on its port."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return int(httpx.get(f"http://127.0.0.1:{port}/sim/stats", timeout=2).json()["pid"])
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def gone(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = proc_stat(pid)
        if stat is None or stat[0] == "Z":  # a zombie waits for its reaper: gone too
            return True
        time.sleep(0.05)
    return False


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def engine_dies_with(proc: subprocess.Popen[str], pid: int, port: int) -> bool:
    """SIGKILL `proc`: the engine (pid, port) is gone soon after."""
    proc.kill()
    proc.wait()
    return gone(pid) and refused(port)


@pytest.fixture
def entry() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([*ENTRY, "--", *ENGINE], stdout=subprocess.PIPE, text=True)
    yield proc
    proc.kill()
    proc.wait()


def test_it_serves_the_engine_on_the_port_it_reports(entry: subprocess.Popen[str]) -> None:
    port = port_of(entry.stdout)
    engine_pid(port)
    answer = httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]


def test_it_stops_the_engine_when_the_job_is_stopped(entry: subprocess.Popen[str]) -> None:
    port = port_of(entry.stdout)
    pid = engine_pid(port)
    entry.send_signal(signal.SIGTERM)  # what Ray's job stop sends
    assert entry.wait(timeout=30) in (0, 128 + signal.SIGTERM)
    assert gone(pid)
    assert refused(port)


def test_it_takes_the_engine_along_when_it_is_killed(entry: subprocess.Popen[str]) -> None:
    """A dead Ray worker's direct children are SIGKILLed: that is this process, not the
    engine, which therefore dies with it."""
    port = port_of(entry.stdout)
    assert engine_dies_with(entry, engine_pid(port), port)


def test_it_stops_the_engine_when_its_supervisor_dies() -> None:
    """The raylet or the job's supervisor killed: the orphaned entrypoint kills its engine
    (a Ray spike left one holding its port after its raylet was SIGKILLed)."""
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"subprocess.Popen({json.dumps([*ENTRY, '--', *ENGINE])})\n"
            "time.sleep(600)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = port_of(supervisor.stdout)
        assert engine_dies_with(supervisor, engine_pid(port), port)
    finally:
        supervisor.kill()


def test_it_exits_with_the_engines_status() -> None:
    done = subprocess.run(
        [*ENTRY, "--", sys.executable, "-c", "import sys; sys.exit(3)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3
    assert done.stdout.startswith(PORT_LINE)


def test_it_refuses_a_missing_command_line() -> None:
    done = subprocess.run([*ENTRY, "--"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "no engine command line" in done.stderr


def test_it_says_why_a_command_cannot_run() -> None:
    done = subprocess.run(
        [*ENTRY, "--", "/nonexistent/engine", "--port", "{port}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 127
    assert "cannot run '/nonexistent/engine'" in done.stderr
