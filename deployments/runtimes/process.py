"""Engines as local subprocesses.

Each engine runs in its own session (and so its own process group), so a Ctrl-C at the
terminal does not reach it and a stop can signal every process the engine spawned. The handle
records the pid with the kernel's start time of that pid, so a recycled pid is never mistaken
for the engine after a restart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from common.redact import redact_argv
from deployments.programs import search_path
from deployments.runtimes.base import Handle, Launch, RuntimeError_, gpu_list, parse_gpu_list

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# Exit codes of children this process started, filled by their reaper threads.
_exit_codes: dict[int, int] = {}
# Children not reaped yet: an exit seen in /proc before the reaper stored its code waits for it.
_children: dict[int, subprocess.Popen[bytes]] = {}

# What an engine inherits from Modelship's environment: the basics a program needs, and the
# variables accelerator stacks and model libraries read. Never Modelship's own secrets
# (SECRET_KEY, DATABASE_URL, REDIS_URL, keys): an engine runs code an operator chose, on
# input callers send. MSHIP_ENGINE_ENV_PASSTHROUGH names more.
PASSED_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM"}
    | {"LD_LIBRARY_PATH", "VIRTUAL_ENV", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE"}
    | {"XDG_CACHE_HOME", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}
)
PASSED_PREFIXES = (
    "LC_",
    "CUDA_",
    "NVIDIA_",
    "ROCR_",
    "HIP_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "TORCH",
    "VLLM_",
    "OMP_",
    "MKL_",
    "GGML_",
    "LLAMA_",
)


def engine_env(extra: dict[str, str], gpus: list[int] | None = None) -> dict[str, str]:
    """The environment of an engine process: the allow-listed part of ours, then the
    engine's own variables. The project folder is on PYTHONPATH so the engines Modelship
    ships import from a working directory of their own; the folder of the Python Modelship
    runs on leads PATH, so an engine installed in its virtualenv (`vllm`) is found. On a GPU
    host the engine sees only the GPUs placed for it, numbered as NVML numbers them."""
    passed = set(PASSED_NAMES) | set(settings.MSHIP_ENGINE_ENV_PASSTHROUGH)
    env = {
        name: value
        for name, value in os.environ.items()
        if name in passed or name.startswith(PASSED_PREFIXES)
    }
    env["PATH"] = search_path(env.get("PATH", os.defpath))
    env["PYTHONPATH"] = str(settings.BASE_DIR)
    env["PYTHONUNBUFFERED"] = "1"
    if gpus is not None:
        visible = gpu_list(gpus)
        env.update(
            CUDA_VISIBLE_DEVICES=visible,
            NVIDIA_VISIBLE_DEVICES=visible or "void",
            # CUDA's own order is fastest first; NVML's (and nvidia-smi's) is the PCI bus's.
            CUDA_DEVICE_ORDER="PCI_BUS_ID",
        )
    return {**env, **extra}


def gpus_in_environment(pid: int) -> list[int] | None:
    """CUDA_VISIBLE_DEVICES of a running process, as device indices; None when unset or
    unreadable."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for entry in raw.split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name == b"CUDA_VISIBLE_DEVICES":
            return parse_gpu_list(value.decode(errors="replace"))
    return None


def work_dir(name: str, replica: int) -> Path:
    """An engine's own working directory (what it writes lands there, not in the project)."""
    path = Path(settings.MSHIP_RUN_DIR) / "engines" / log_path(name, replica).stem
    path.mkdir(parents=True, exist_ok=True)
    return path


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


PORT_HELD_S = 900.0  # an engine binds its port once loaded: at most the start timeout


def engine_port(host: str) -> int:
    """A free port no other start of this host was handed in the last PORT_HELD_S: engines
    start side by side (the start gate covers claims, not health waits) and one that binds
    its port late (vLLM, once its weights are loaded) must not find it taken by another
    engine that was given it meanwhile. Each port handed out is a file in MSHIP_RUN_DIR,
    made exclusively, so two processes of the host never take the same."""
    folder = Path(settings.MSHIP_RUN_DIR) / "ports"
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():  # handed out long ago: its engine bound it or is gone
        with contextlib.suppress(FileNotFoundError):
            if time.time() - old.stat().st_mtime > PORT_HELD_S:
                old.unlink()
    for _ in range(64):
        port = free_port(host)
        taken = folder / str(port)
        try:
            os.close(os.open(taken, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            continue  # handed to a start still loading: another
        return port
    return free_port(host)


def proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a pid, or None when there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name may contain spaces and parentheses: split after its last ')'.
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[19])


def log_path(name: str, replica: int) -> Path:
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return Path(settings.MSHIP_ENGINE_LOG_DIR) / f"{safe}-{replica}.log"


class ProcessRuntime:
    name = "process"

    def launch(self, launch: Launch) -> Handle:
        host = settings.MSHIP_ENGINE_HOST
        port = engine_port(host)
        argv = [part.replace("{host}", host).replace("{port}", str(port)) for part in launch.argv]
        log = log_path(launch.name, launch.replica)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            offset = out.tell()
            shown = " ".join(redact_argv(argv))
            out.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shown}\n".encode())
            out.flush()
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=engine_env(launch.env, launch.gpus),
                    cwd=work_dir(launch.name, launch.replica),
                    start_new_session=True,
                )
            except OSError as exc:
                raise RuntimeError_(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from exc
        # Reap the child when it exits, so a dead engine is not left a zombie that looks alive.
        _children[proc.pid] = proc
        threading.Thread(target=self._reap, args=(proc,), daemon=True).start()
        stat = proc_stat(proc.pid)
        return {
            "runtime": self.name,
            "replica": launch.replica,
            "pid": proc.pid,
            "start_ticks": stat[1] if stat else 0,
            "port": port,
            "url": f"http://{host}:{port}",
            "log": str(log),
            "log_offset": offset,
            "fingerprint": launch.fingerprint,
            "gpus": launch.gpus,
        }

    @staticmethod
    def _reap(proc: subprocess.Popen[bytes]) -> None:
        _exit_codes[proc.pid] = proc.wait()
        _children.pop(proc.pid, None)

    def is_alive(self, handle: Handle) -> bool:
        stat = proc_stat(int(handle.get("pid", 0) or 0))
        if stat is None or stat[0] in ("Z", "X"):
            return False
        return not handle.get("start_ticks") or stat[1] == handle["start_ticks"]

    def exit_reason(self, handle: Handle) -> str:
        code = exit_code(int(handle.get("pid", 0) or 0))
        if code is None:
            return "the engine process is gone"
        if code < 0:
            return f"the engine was killed by signal {signal.Signals(-code).name}"
        return f"the engine exited with code {code}"

    def stop(self, handle: Handle, grace_s: float) -> None:
        pid = int(handle.get("pid", 0) or 0)
        if pid <= 0:
            return
        if self.is_alive(handle):
            self._signal_group(pid, signal.SIGTERM)
            if not self._wait_gone(handle, grace_s):
                self._signal_group(pid, signal.SIGKILL)
                if not self._wait_gone(handle, 10.0):
                    raise RuntimeError_(f"engine pid {pid} survived SIGKILL")
        # Children the engine spawned share its process group; leave none behind.
        self._signal_group(pid, signal.SIGKILL)

    def _signal_group(self, pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def _wait_gone(self, handle: Handle, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        delay = 0.01
        while time.monotonic() < deadline:
            if not self.is_alive(handle):
                return True
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        return not self.is_alive(handle)

    def follow_log(self, handle: Handle, stop: threading.Event | None = None) -> Iterator[str]:
        # A log file offers no event to wait on: poll it for growth while the engine lives.
        path = Path(handle.get("log", ""))
        try:
            log = path.open("rb")
        except OSError:
            return
        with log:
            log.seek(0, os.SEEK_END)
            pending = b""
            while True:
                chunk = log.read()
                if chunk:
                    pending += chunk
                    *complete, pending = pending.split(b"\n")
                    for line in complete:
                        yield line.decode(errors="replace")
                elif not self.is_alive(handle) or (stop is not None and stop.is_set()):
                    return
                else:
                    time.sleep(0.2)

    def managed(self) -> list[Handle] | None:
        return None  # processes carry no labels: only the handles on the rows know them

    def remove(self, handle: Handle) -> None:
        self.stop(handle, 0)

    def prepare(self, image: str, progress: Callable[[str], None] | None = None) -> None:
        return  # a process needs no image

    def gpus_of(self, handle: Handle) -> list[int] | None:
        if not self.is_alive(handle):
            return None
        return gpus_in_environment(int(handle.get("pid", 0) or 0))

    def log_tail(self, handle: Handle, lines: int) -> str:
        try:
            data = tail_bytes(Path(handle.get("log", "")), lines, int(handle.get("log_offset", 0)))
        except OSError:
            return ""
        text = data.decode(errors="replace").splitlines()
        return "\n".join(text[-lines:])


TAIL_BLOCK = 64 * 1024
TAIL_BYTES_PER_LINE = 4096  # a tail reads at most this much per line asked (a longer line is cut)


def tail_bytes(path: Path, lines: int, start: int = 0) -> bytes:
    """The end of a file from `start` on that holds its last `lines` lines, read backwards a
    block at a time: an engine's log grows for as long as it runs (and keeps earlier runs),
    so it is never read whole."""
    limit = max(TAIL_BLOCK, lines * TAIL_BYTES_PER_LINE)
    with path.open("rb") as log:
        end = log.seek(0, os.SEEK_END)
        begin = end
        blocks: list[bytes] = []
        newlines = 0
        # One newline more than lines asked: the last line ends in one, the first may be cut.
        while begin > start and newlines <= lines and end - begin < limit:
            size = min(TAIL_BLOCK, begin - start)
            begin -= size
            log.seek(begin)
            block = log.read(size)
            blocks.append(block)
            newlines += block.count(b"\n")
        return b"".join(reversed(blocks))


def exit_code(pid: int) -> int | None:
    """How a child of this process ended. The process leaves /proc (or turns zombie) a
    moment before its reaper stores the code: a child still being reaped is waited for."""
    code = _exit_codes.get(pid)
    child = _children.get(pid)
    if code is None and child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = child.wait(timeout=5)
    return code if code is not None else _exit_codes.get(pid)
