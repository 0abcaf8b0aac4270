"""What a Ray job runs: an engine's own command line, on whichever node Ray placed it.

    python -m deployments.engines.ray_entry [--bind ADDRESS | --node-ips IP,...]
        [--env-file PATH] [--grace S] -- ARGV...

Ray picks the node, so the engine's address and port are picked here: the node's own address
(of the cluster's node addresses the runtime passes in --node-ips, the one this machine has;
loopback where none is), never every interface, and a free port on it, printed as two lines
(PORT_LINE, HOST_LINE) before the engine starts, for the ray runtime to read from the job's
log. `{host}` and `{port}` in ARGV become that address and port.

The engine's environment (HF_TOKEN among it) comes from --env-file, a JSON object the
runtime wrote readable by its owner only, never from the job's submission (whose runtime_env
anyone who reaches the dashboard can read); the file is removed once read.

The engine stays in this process's group, so that Ray's own stop (a signal to the entrypoint
and all its descendants) and its clean-up after a dead supervisor (a SIGKILL to the
entrypoint's group) reach it; the runtime starts this module with `exec`, so it is that
group's leader. A SIGTERM or SIGINT goes on to the whole group, then a SIGKILL after
`--grace` seconds. When this process is orphaned (the node's raylet or the job's supervisor
died), the group is stopped the same way: a Ray spike left an engine running after its
raylet was SIGKILLed, and on a real cluster such an engine keeps its port and its GPU with
nothing left to stop it. Ray SIGKILLs a dead worker's direct children, which is this process
and not the engine: the engine is therefore started with a parent-death signal (SIGKILL, on
Linux) as well. The exit status is the engine's (128 + N for a signal N).

Standard library only: it runs under the node's Python, whatever environment the engine
command itself uses.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading

PORT_LINE = "modelship-engine-port: "
HOST_LINE = "modelship-engine-host: "
WATCH_S = 0.5  # how often the parent and the stop signal are looked at


def free_port(bind: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((bind, 0))
        return int(probe.getsockname()[1])


def node_address(candidates: list[str]) -> str:
    """The first of the cluster's node addresses that this machine has (binding to it
    works); loopback where it has none of them."""
    for address in candidates:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                continue
            return address
    return "127.0.0.1"


def read_env(path: str) -> dict[str, str]:
    """The engine's environment from the runtime's file, which is removed once read (it
    holds secrets); ValueError naming the file, never its contents."""
    try:
        with open(path) as handle:
            values = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ValueError(f"the engine's environment {path} cannot be read: {exc}") from None
    with contextlib.suppress(OSError):
        os.unlink(path)
    if not isinstance(values, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in values.items()
    ):
        raise ValueError(f"the engine's environment {path} is not an object of strings")
    return values


def exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


def stop_group(engine: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGTERM to the group (this process only notes it), SIGKILL to the group after the
    grace; the engine's exit status."""
    os.killpg(os.getpgrp(), signal.SIGTERM)
    try:
        return exit_status(engine.wait(timeout=grace_s))
    except subprocess.TimeoutExpired:
        os.killpg(os.getpgrp(), signal.SIGKILL)  # this process too: nothing is left to do
        raise


def die_with_parent() -> None:
    """In the engine, before exec: SIGKILL when this process dies (prctl PR_SET_PDEATHSIG)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ray_entry", description=__doc__.split("\n\n")[0])
    p.add_argument("--bind", default="", help="the address the engine listens on")
    p.add_argument(
        "--node-ips", default="", help="the cluster's node addresses: the engine binds this one's"
    )
    p.add_argument("--env-file", default="", help="the engine's environment, a JSON object")
    p.add_argument("--grace", type=float, default=10.0, help="seconds from SIGTERM to SIGKILL")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- and the engine's command line")
    return p


def main(args: list[str] | None = None) -> int:
    options = parser().parse_args(args)
    argv = options.argv[1:] if options.argv[:1] == ["--"] else options.argv
    if not argv:
        parser().error("no engine command line after --")
    try:
        env = {**os.environ, **read_env(options.env_file)} if options.env_file else None
    except ValueError as exc:
        print(f"ray_entry: {exc}", file=sys.stderr)
        return 126
    bind = options.bind or node_address([a for a in options.node_ips.split(",") if a])
    port = free_port(bind)
    command = [a.replace("{host}", bind).replace("{port}", str(port)) for a in argv]
    # One write, so the runtime never reads the port without the address.
    print(f"{PORT_LINE}{port}\n{HOST_LINE}{bind}", flush=True)
    parent = os.getppid()
    if os.getpgrp() == os.getpgid(parent):
        os.setpgid(0, 0)  # a group of its own: signals to it never reach whoever started it
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    # A Ray worker blocks some signals, and a mask is inherited: the engine must hear a stop.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        engine = subprocess.Popen(command, env=env, preexec_fn=die_with_parent)
    except OSError as exc:
        print(f"ray_entry: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    while True:
        try:
            return exit_status(engine.wait(timeout=WATCH_S))
        except subprocess.TimeoutExpired:
            pass
        if os.getppid() != parent:
            print("ray_entry: the job's supervisor is gone; stopping the engine", file=sys.stderr)
            return stop_group(engine, options.grace)
        if stop.is_set():
            return stop_group(engine, options.grace)


if __name__ == "__main__":
    sys.exit(main())
