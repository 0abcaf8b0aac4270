"""manage.py serve: the ASGI server and the django-q cluster together, in the foreground.

Ctrl-C (or SIGTERM) stops both, then every engine they started. On the way up it adopts the
engines a previous run left behind and starts the always-on deployments that its last
shutdown stopped.

`--workers N` runs N server processes on one port: each inherits a listening socket of its
own, all made here with SO_REUSEPORT, so the kernel spreads connections over them by their
addresses. (On one shared socket the worker that woke first took the whole backlog: a burst
of 32 connections could all land on one worker.) A socket outlives its worker, so the
connections queued on it wait for the worker's restart instead of being refused. What the
workers must agree on is shared through the database and Redis (README, "More than one
machine"), and their scheduling (on-demand slots, the queue, make-room, max_concurrency) has
one owner: with more than one worker, or with MSHIP_SCHEDULER_LISTEN set for other gateway
hosts, a `scheduler` process beside them (ondemand/scheduler/), which they reach on a Unix
socket in MSHIP_RUN_DIR; a lone worker owns it itself. A worker or the scheduler that dies
after it has served is started again; one that dies at its start stops Modelship, as a lone
server does.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from deployments import tasks
from deployments.adoption import adopt_all, stop_all, to_start_at_serve
from deployments.autoscaler import Autoscaler
from deployments.management.commands.ensure_admin import AdminLogin, ensure_admin
from deployments.models import Mode
from deployments.site_hints import hints
from deployments.task_queue import enqueue
from modelship_site.metrics import fresh_metrics, process_gone
from modelship_site.var_check import secure_var
from modelship_site.workers import worker_count
from ondemand.guard import ensure_key_file
from openai_api.dev_key import ensure_dev_key

CHILD_GRACE_S = 15
# A worker that dies sooner after its start is not started again: it would die again.
WORKER_MIN_UPTIME_S = 10.0
LISTEN_BACKLOG = 2048  # uvicorn's own
UNIX_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, with its "unix:" prefix here


class Command(BaseCommand):
    help = "Run Modelship: the ASGI server (uvicorn, or daphne) and the django-q cluster."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--models", help="a models.yaml to deploy once the cluster runs")
        # uvicorn with Modelship's limits (modelship_site/server.py says why not daphne).
        parser.add_argument("--server", choices=["uvicorn", "daphne"], default="uvicorn")
        parser.add_argument(
            "--workers",
            default=None,
            help="server processes sharing the port (uvicorn only): a number, or 'auto' (one"
            " per core where the host has more than two; MSHIP_SERVE_WORKERS, the default)",
        )
        parser.add_argument(
            "--no-cluster",
            action="store_true",
            help="run no django-q cluster here (they run beside it: compose.yaml's cluster and"
            " pulls; by hand, `manage.py qcluster`, and again with"
            " Q_CLUSTER_NAME=<MSHIP_Q_NAME>-pulls for the model store's pulls)",
        )
        parser.add_argument(
            "--gateway-only",
            action="store_true",
            help="one more gateway host of a site: serve only, leaving the engines (adoption,"
            " the cluster, the autoscaler, the stop at shutdown) to the host that runs them",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            asked = options["workers"] or settings.MSHIP_SERVE_WORKERS
            options["workers"] = worker_count(str(asked), options["server"])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        # Before anything else: a port that is taken stops Modelship before it starts.
        self.listeners = self.listen(options) if options["server"] == "uvicorn" else []
        stop_event = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop_event.set())

        for warning in secure_var():  # before a secret is written to var/
            self.stderr.write(f"warning: {warning}")
        login = ensure_admin()
        key_file = settings.MSHIP_ONDEMAND_KEY_FILE
        if ensure_key_file(key_file):
            self.stdout.write(f"made the on-demand gateway's key (for LiteLLM): {key_file}")
        gateway_only = bool(options.get("gateway_only"))
        if gateway_only:
            options["no_cluster"] = True
        else:
            call_command("setup_schedules", stdout=self.stdout)
            fresh_metrics()
            outcome = adopt_all()
            if outcome["adopted"]:
                self.stdout.write(f"adopted running engines: {', '.join(outcome['adopted'])}")
            threading.Thread(target=Autoscaler().run, args=(stop_event,), daemon=True).start()
        self.scheduler = self.scheduler_address(options, gateway_only)
        children = self.start_children(options)
        exited: list[str] = []
        for name in list(children):
            threading.Thread(
                target=self.watch, args=(name, children, exited, stop_event), daemon=True
            ).start()
        try:
            url = f"http://{options['host']}:{options['port']}"
            self.stdout.write(f"Modelship on {url}  (admin: {url}/admin/, API: {url}/api/)")
            self.say_credentials(url, login)
            for hint in hints():
                self.stdout.write(f"To set for this host: {hint}")
            if options["models"]:
                try:
                    call_command("deploy", file=options["models"], stdout=self.stdout)
                except CommandError as exc:
                    # A broken file changed nothing; Modelship still serves what it has.
                    self.stderr.write(str(exc))
            if not gateway_only:
                self.resume_after_shutdown()
            self.stdout.write("Ctrl-C stops Modelship and every engine it started.")
            stop_event.wait()
        finally:
            self.shutdown(children, stop_engines=not gateway_only)
        if exited:
            codes = ", ".join(f"the {n} exited with code {children[n].returncode}" for n in exited)
            raise CommandError(f"Modelship stopped: {codes}")

    def say_credentials(self, url: str, login: AdminLogin) -> None:
        """Secrets are printed once, by the run that made them; later runs say where they
        are kept."""
        var = settings.VAR_DIR
        if login.password:
            self.stdout.write(f"Sign in as {login.username!r} with password {login.password!r}")
        else:
            self.stdout.write(f"Sign in as {login.username!r} (password: {var}/admin_password)")
        if login.token:
            self.stdout.write(f"/api token of {login.username!r}: {login.token}")
        key = ensure_dev_key()
        off = "  (authentication is off)" if not settings.MSHIP_AUTH else ""
        if key.created:
            self.stdout.write(f"OpenAI-compatible API: {url}/v1  with the key {key.secret}{off}")
        elif key.revoked:
            self.stdout.write(
                f"OpenAI-compatible API: {url}/v1  (the key in {var}/api_key was revoked;"
                " make a new one in the admin){off}"
            )
        else:
            self.stdout.write(
                f"OpenAI-compatible API: {url}/v1  with the key in {var}/api_key{off}"
            )

    @staticmethod
    def listen(options: dict[str, Any]) -> list[socket.socket]:
        """A listening socket for each server process, on one port."""
        host, port, workers = options["host"], options["port"], options["workers"]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listeners: list[socket.socket] = []
        try:
            if workers > 1:
                # Sockets with SO_REUSEPORT share a port with any other such socket of this
                # user, another Modelship's too: one without it finds the port taken first.
                with socket.socket(family, socket.SOCK_STREAM) as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    probe.bind((host, port))
                    port = probe.getsockname()[1]
            for _ in range(workers):
                listener = socket.socket(family, socket.SOCK_STREAM)
                listeners.append(listener)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if workers > 1:
                    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                listener.bind((host, port))
                port = listener.getsockname()[1]  # port 0: the others take the one it got
                listener.listen(LISTEN_BACKLOG)
                listener.set_inheritable(True)
        except OSError as exc:
            for listener in listeners:
                listener.close()
            raise CommandError(
                f"Modelship stopped: cannot listen on {host}:{options['port']}: {exc}"
            ) from exc
        return listeners

    def watch(
        self,
        name: str,
        children: dict[str, subprocess.Popen[bytes]],
        exited: list[str],
        stop: threading.Event,
    ) -> None:
        while True:
            child = children[name]
            began = time.monotonic()
            child.wait()
            process_gone(child.pid)  # its live gauges stop counting
            lived = time.monotonic() - began
            again = name.startswith("server-") or name == "scheduler"
            if again and not stop.is_set() and lived > WORKER_MIN_UPTIME_S:
                self.stderr.write(f"{name} exited with code {child.returncode}: starting it again")
                # A new owner waits for the gateways to say what they hold (not --fresh).
                argv = [a for a in self.commands[name] if a != "--fresh"]
                children[name] = self.spawn(argv)
                continue
            if not stop.is_set():
                exited.append(name)
            stop.set()
            return

    def scheduler_address(self, options: dict[str, Any], gateway_only: bool) -> str:
        """Where the site's scheduler owner listens for this host's workers ("" where the
        one worker owns it); set in the environment its children inherit."""
        if gateway_only:
            if not settings.MSHIP_SCHEDULER_URL:
                self.stderr.write(
                    "warning: no MSHIP_SCHEDULER_URL: this gateway host schedules its own"
                    " on-demand requests and limits apart from the engine host's (set it to"
                    " the engine host's MSHIP_SCHEDULER_LISTEN)"
                )
            return ""
        named = settings.MSHIP_SCHEDULER_URL or settings.MSHIP_SCHEDULER_LISTEN
        if options["workers"] <= 1 and not named:
            return ""  # the lone worker owns the scheduling
        run_dir = Path(settings.MSHIP_RUN_DIR)
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        url = settings.MSHIP_SCHEDULER_URL or f"unix:{run_dir / 'scheduler.sock'}"
        if len(url) > UNIX_PATH_MAX:
            raise CommandError(
                f"Modelship stopped: the scheduler's socket path is too long for a Unix socket"
                f" ({url}); set MSHIP_RUN_DIR to a shorter folder"
            )
        os.environ["MSHIP_SCHEDULER_URL"] = url
        return url

    def start_children(self, options: dict[str, Any]) -> dict[str, subprocess.Popen[bytes]]:
        python = sys.executable
        self.commands: dict[str, list[str]] = {}
        if self.scheduler:
            self.commands["scheduler"] = [python, "manage.py", "scheduler", "--fresh"]
        if self.listeners:
            lone = len(self.listeners) == 1
            for i, listener in enumerate(self.listeners):
                server = [python, "-m", "modelship_site.server", "--fd", str(listener.fileno())]
                server += ["--host", options["host"], "--port", str(options["port"])]
                self.commands["server" if lone else f"server-{i + 1}"] = server
        else:
            server = [python, "-m", "daphne", "-b", options["host"], "-p", str(options["port"])]
            self.commands["server"] = [*server, "modelship_site.asgi:application"]
        envs: dict[str, dict[str, str]] = {}
        if not options.get("no_cluster"):
            self.commands["cluster"] = [python, "manage.py", "qcluster"]
            # The pulls' own cluster: a download never holds the main cluster's workers.
            self.commands["pulls"] = [python, "manage.py", "qcluster"]
            envs["pulls"] = {"Q_CLUSTER_NAME": settings.MSHIP_PULLS_CLUSTER}
        return {name: self.spawn(argv, envs.get(name, {})) for name, argv in self.commands.items()}

    def spawn(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        # Own process groups: the terminal's Ctrl-C reaches this command only, which then
        # stops the children in order instead of all at once.
        inherited = [int(argv[argv.index("--fd") + 1])] if "--fd" in argv else []
        return subprocess.Popen(
            argv,
            start_new_session=True,
            env={**os.environ, **(env or {})},
            pass_fds=inherited,
        )

    def resume_after_shutdown(self) -> None:
        """Always-on deployments the last shutdown stopped, and on-demand ones to preload."""
        for deployment in to_start_at_serve():
            actor = "system" if deployment.effective_mode == Mode.ALWAYS_ON else "preload"
            enqueue(tasks.start, deployment.pk, actor)

    def shutdown(
        self, children: dict[str, subprocess.Popen[bytes]], *, stop_engines: bool = True
    ) -> None:
        self.stdout.write("stopping the server and the cluster…")
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children.values():
            try:
                child.wait(CHILD_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        if not stop_engines:
            self.stdout.write("engines left running: they are the engine host's")
            return
        stopped = stop_all()
        self.stdout.write(f"stopped engines: {', '.join(stopped) or 'none'}")
