"""scripts/gpu_check.py, dry: every step of the GPU host's check is listed with its command,
and what each runs is there (the day a GPU is lent, the run does not fail on a renamed file);
a checkout missing one of them fails the dry run, naming it."""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

SCRIPT = "scripts/gpu_check.py"


def dry(*more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, SCRIPT, "--dry-run", *more], capture_output=True, text=True, check=False
    )


def test_it_lists_every_step_with_its_command_and_finds_what_each_runs() -> None:
    done = dry()
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("migrate", "nvml", "vllm-env", "vllm-suite", "vllm-figures"):
        assert f"| {name} | ready |" in done.stdout
    assert "manage.py gpu_check --require-gpu --compare-nvidia-smi --place-demo" in done.stdout
    assert "tests/test_vllm_gpu_figures.py" in done.stdout


def test_it_fails_a_dry_run_where_a_step_would_not_find_what_it_runs(tmp_path: Path) -> None:
    (tmp_path / "manage.py").write_text("")  # a checkout with manage.py and nothing else
    done = dry("--root", str(tmp_path), "--only", "migrate,vllm-figures")
    assert done.returncode == 1
    assert "| migrate | missing: .venv/bin/python |" in done.stdout
    assert "| vllm-figures | missing: tests/test_vllm_gpu_figures.py, .venv/bin/python |" in (
        done.stdout
    )
    unknown = dry("--only", "nvml,warp-drive")
    assert unknown.returncode == 2 and "no step named warp-drive" in unknown.stderr
