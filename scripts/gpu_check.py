"""Every check and measurement this project cannot make without a GPU, as one run on a GPU
host: each step's name, what it shows, and its command; a table of the steps (passed or
failed, seconds) at the end, and a non-zero exit on any failure.

    .venv/bin/python scripts/gpu_check.py [--dry-run] [--only NAME[,NAME]] [--root DIR]

`--dry-run` prints each step's command and checks that what it runs is there (the program,
the management command, the test files) without running any: `make test` runs it
(tests/test_gpu_check.py), so the day a GPU is lent the run does not fail on a renamed file.
Run from a fresh clone after `make setup`; the vLLM steps install vLLM's CUDA environment
once (pip needs its index then).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Step:
    name: str
    shows: str
    argv: tuple[str, ...]
    files: tuple[str, ...] = ()  # under the root: what the command reads
    env: dict[str, str] = field(default_factory=dict)


def python() -> str:
    return ".venv/bin/python"


def pytest_step(name: str, shows: str, *tests: str) -> Step:
    argv = (python(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rw", *tests)
    env = {"MSHIP_TEST_HEAVY": "1", "MSHIP_Q_NAME": "modelship-gpu-check"}
    return Step(name, shows, argv, tuple(t.split("::")[0] for t in tests), env)


STEPS = (
    Step(
        "migrate",
        "the check's own database (MSHIP_VAR_DIR: a folder of its own unless set)",
        (python(), "manage.py", "migrate", "--noinput", "-v0"),
        ("manage.py",),
    ),
    Step(
        "nvml",
        "NVML as Modelship reads it against nvidia-smi; two num_gpus 0.5 deployments placed",
        (
            python(),
            "manage.py",
            "gpu_check",
            "--require-gpu",
            "--compare-nvidia-smi",
            "--place-demo",
        ),
        ("manage.py", "deployments/management/commands/gpu_check.py"),
    ),
    Step(
        "vllm-env",
        "vLLM's CUDA build installed in its own environment",
        (python(), "manage.py", "engine_env", "install", "vllm"),
        ("manage.py", "deployments/engines/requirements/vllm.txt"),
    ),
    pytest_step(
        "vllm-suite",
        "the vLLM suite on CUDA: sleep mode, make-room's sleep, a wake; the KV offload across"
        " a sleep (its figure in a warning); the recorded streams",
        "tests/test_vllm.py",
        "tests/test_vllm_streams.py",
    ),
    pytest_step(
        "vllm-figures",
        "start to ready and first token, sleep level 1 and 2 and their wakes, the KV cache"
        " vLLM allocated against the sequences Modelship says fit, an out-of-memory start"
        " learned and recovered (a table in warnings)",
        "tests/test_vllm_gpu_figures.py",
    ),
)


def missing(step: Step, root: Path) -> list[str]:
    """What the step runs that is not there."""
    gone = [f for f in step.files if not (root / f).exists()]
    program = step.argv[0]
    if "/" in program:
        if not (root / program).exists():
            gone.append(program)
    elif shutil.which(program) is None:
        gone.append(program)
    return gone


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print and check, run nothing")
    parser.add_argument("--only", default="", help="these steps only (comma-separated names)")
    parser.add_argument("--root", default=str(REPO), help="the checkout the steps run in")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    wanted = {n for n in args.only.split(",") if n}
    unknown = wanted - {s.name for s in STEPS}
    if unknown:
        print(f"gpu_check: no step named {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    steps = [s for s in STEPS if not wanted or s.name in wanted]
    if not args.dry_run and "MSHIP_VAR_DIR" not in os.environ:
        os.environ["MSHIP_VAR_DIR"] = tempfile.mkdtemp(prefix="modelship-gpu-check.")
    rows: list[tuple[str, str, float]] = []
    for step in steps:
        print(f"== {step.name}: {step.shows}\n   {' '.join(step.argv)}", flush=True)
        gone = missing(step, root)
        if gone:
            rows.append((step.name, f"missing: {', '.join(gone)}", 0.0))
            continue
        if args.dry_run:
            rows.append((step.name, "ready", 0.0))
            continue
        began = time.monotonic()
        done = subprocess.run(step.argv, cwd=root, env={**os.environ, **step.env}, check=False)
        outcome = "passed" if done.returncode == 0 else f"failed (exit {done.returncode})"
        rows.append((step.name, outcome, time.monotonic() - began))
    print("\n| step | outcome | seconds |\n| --- | --- | --- |")
    for name, outcome, seconds in rows:
        print(f"| {name} | {outcome} | {seconds:.0f} |")
    good = ("ready",) if args.dry_run else ("passed",)
    return 0 if all(outcome in good for _, outcome, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
