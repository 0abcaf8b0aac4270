"""manage.py engine_env: the engine families' own virtualenvs (deployments/engine_envs.py)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from deployments import engine_envs
from deployments.launch import deployment_families
from deployments.loaders import vllm

if TYPE_CHECKING:
    from pathlib import Path


class Command(BaseCommand):
    help = (
        "List the engine environments (this checkout's families and the machine-wide cache),"
        " install one (or --all) before a first start, print its Python, or prune the cache."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["list", "install", "python", "prune"])
        parser.add_argument("family", nargs="?", help="an engine family (see list)")
        parser.add_argument(
            "--unused-days",
            type=float,
            default=0,
            help="prune: only environments not used for this many days",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="prune: say what would go, remove nothing"
        )
        parser.add_argument(
            "--all", action="store_true", help="install: every family, several at once"
        )
        parser.add_argument(
            "--jobs",
            type=int,
            default=4,
            help="install --all: how many at once (downloads overlap; default 4)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        action, family = options["action"], options["family"]
        if action == "list":
            return self.list()
        if action == "prune":
            return self.prune(options["unused_days"], options["dry_run"])
        if action == "install" and options["all"]:
            if family:
                raise CommandError("install --all takes no family")
            return self.install_all(options["jobs"])
        if not family:
            raise CommandError(f"which family? ({', '.join(engine_envs.families())})")
        try:
            if action == "install":
                python = engine_envs.ensure(family, lambda line: self.stdout.write(line))
                self.stdout.write(f"{family}: ready ({python})")
            elif not engine_envs.ready(family):
                raise CommandError(f"{family}: not installed (manage.py engine_env install)")
            else:
                self.stdout.write(engine_envs.python(family))
        except engine_envs.EnvFailed as exc:
            raise CommandError(str(exc)) from exc

    def install_all(self, jobs: int) -> None:
        """Every family's environment this host can run (of vLLM's two builds, its own),
        `jobs` at a time (make test makes them before the suite, beside the lint); each says
        when it is ready and how long it took, and every family is tried before the failures
        are reported."""
        if jobs < 1:
            raise CommandError("--jobs must be at least 1")
        ours = vllm.host_family()
        wanted = [
            name for name in engine_envs.families() if name not in vllm.FAMILIES or name == ours
        ]

        def one(family: str) -> str | None:
            began = time.monotonic()
            try:
                engine_envs.ensure(family, lambda line: self.stdout.write(f"{family}: {line}"))
            except engine_envs.EnvFailed as exc:
                self.stderr.write(f"{family}: {exc}")
                return family
            self.stdout.write(f"{family}: ready in {time.monotonic() - began:.1f} s")
            return None

        with ThreadPoolExecutor(jobs) as pool:
            failed = [name for name in pool.map(one, wanted) if name]
        if failed:
            raise CommandError(f"not installed: {', '.join(failed)} (each one's words above)")

    def list(self) -> None:
        """A line per family of this checkout, then the cache's other environments."""
        self.stdout.write(f"cache: {engine_envs.root()}")
        self.stdout.write("family\tstate\tsize\tlast used\tpath")
        named = engine_envs.named()
        for target, family in named.items():
            why = engine_envs.damage(target)
            state = "ready" if why is None else why
            self.stdout.write(f"{family}\t{state}\t{self.facts(target)}\t{target}")
        for target in engine_envs.cached():
            if target not in named:
                self.stdout.write(f"-\tnot named (prune)\t{self.facts(target)}\t{target}")

    def facts(self, target: Path) -> str:
        if not target.exists():
            return "-\t-"
        used = engine_envs.last_used(target)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(used)) if used else "-"
        return f"{engine_envs.size_of(target) / 2**20:.0f} MiB\t{when}"

    def prune(self, unused_days: float, dry_run: bool) -> None:
        """Remove the cached environments no family of this checkout and no deployment names
        (another clone's environments are pruned too: it installs them again when needed)."""
        keep = set(engine_envs.named())
        keep |= {engine_envs.location(family) for family in deployment_families()}
        horizon = time.time() - unused_days * 86400
        freed = 0
        for target in engine_envs.cached():
            used = engine_envs.last_used(target) or 0
            if target in keep or used > horizon:
                continue
            size = engine_envs.size_of(target)
            if dry_run:
                self.stdout.write(f"would remove {target} ({size / 2**20:.0f} MiB)")
            elif engine_envs.remove(target):
                freed += size
                self.stdout.write(f"removed {target} ({size / 2**20:.0f} MiB)")
            else:
                self.stdout.write(f"kept {target}: an install of it is under way")
        if not dry_run:
            self.stdout.write(f"freed {freed / 2**20:.0f} MiB")
