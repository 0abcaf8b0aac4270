"""Engine environments in the machine-wide cache: made by uv (pip as the fallback), addressed
by what they install, shared by two installs at once, and never used when damaged (a killed
install, a removed interpreter, a deleted file, a full disk)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.core.management import CommandError, call_command

from common import installer
from deployments import engine_envs
from deployments.loaders import vllm
from tests.conftest import REPO

if TYPE_CHECKING:
    from collections.abc import Iterator

# A small family: one pure-Python wheel, installed in about a second by uv.
SMALL = "termcolor==3.3.0\n"


@pytest.fixture
def cache(site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of its own and a requirements folder with the family `small`."""
    requirements = tmp_path / "requirements"
    requirements.mkdir()
    (requirements / "small.txt").write_text(SMALL)
    monkeypatch.setattr(engine_envs, "REQUIREMENTS_DIR", requirements)
    site.MSHIP_ENGINE_ENVS_DIR = tmp_path / "engines"
    return tmp_path / "engines"


def imports_termcolor(python: str) -> bool:
    return subprocess.run([python, "-c", "import termcolor"], check=False).returncode == 0


def test_it_makes_an_environment_with_uv_named_by_what_it_installs(cache: Path) -> None:
    heard: list[str] = []
    python = engine_envs.ensure("small", heard.append)
    target = engine_envs.location("small")
    assert target.parent == cache and target.name == f"small-{engine_envs.digest('small')}"
    assert heard == [f"installing the small engine environment with uv: {target}.log"]
    assert "uv pip install" in Path(f"{target}.log").read_text()
    assert imports_termcolor(python) and not imports_termcolor(sys.executable)
    # Ready: the next start installs nothing.
    heard.clear()
    assert engine_envs.ensure("small", heard.append) == python and heard == []
    # A changed requirements file is another environment beside it; the first stays.
    (engine_envs.REQUIREMENTS_DIR / "small.txt").write_text(SMALL + "# edited\n")
    assert engine_envs.location("small") != target and not engine_envs.ready("small")
    assert target.is_dir()


def test_it_rebuilds_an_environment_with_a_file_deleted_or_changed(cache: Path) -> None:
    python = engine_envs.ensure("small")
    target = engine_envs.location("small")
    module = next(target.glob("lib/python*/site-packages/termcolor/__init__.py"))
    module.unlink()
    assert engine_envs.damage(target) == f"{module.relative_to(target)} is missing"
    assert not engine_envs.ready("small")
    heard: list[str] = []
    assert engine_envs.ensure("small", heard.append) == python
    assert "damaged" in heard[0] and "__init__.py is missing" in heard[0]
    assert module.is_file() and imports_termcolor(python)
    module.unlink()  # a new file, not the one uv's cache may share (a hard link)
    module.write_text("raise ImportError('truncated')\n")
    assert "__init__.py has changed" in str(engine_envs.damage(target))


def test_it_rebuilds_an_environment_whose_python_is_gone(cache: Path) -> None:
    python = Path(engine_envs.ensure("small"))
    # The interpreter it was made with removed (a Python upgrade that took the old one).
    python.unlink()
    python.symlink_to(cache / "no-such-python3.11")
    assert "its Python is gone" in str(engine_envs.damage(engine_envs.location("small")))
    engine_envs.ensure("small")
    assert imports_termcolor(str(python))


def test_it_never_uses_an_install_that_was_killed(cache: Path) -> None:
    """An install killed after the installer ran but before it was checked and stamped
    leaves a folder that is not ready, and the next install makes it afresh."""
    child = subprocess.run(
        [sys.executable, "-c", in_child("installer.install = killed_after(installer.install)")],
        env=child_env(cache),
        cwd=REPO,
        check=False,
    )
    assert child.returncode == -signal.SIGKILL
    target = engine_envs.location("small")
    assert (target / "pyvenv.cfg").exists()
    assert engine_envs.damage(target) == "not installed to the end"
    assert not engine_envs.ready("small")
    heard: list[str] = []
    python = engine_envs.ensure("small", heard.append)
    assert "not installed to the end" in heard[0] and imports_termcolor(python)


def in_child(then: str = "") -> str:
    """A script that asks for `small` from this test's requirements folder, in a process
    of its own (another clone, another gateway)."""
    return "\n".join(
        [
            "import os, signal, django",
            "django.setup()",
            "from pathlib import Path",
            "from common import installer",
            "from deployments import engine_envs",
            f"engine_envs.REQUIREMENTS_DIR = Path({str(engine_envs.REQUIREMENTS_DIR)!r})",
            "def killed_after(step):",
            "    def run(*args, **kwargs):",
            "        step(*args, **kwargs)",
            "        os.kill(os.getpid(), signal.SIGKILL)",
            "    return run",
            then,
            "print(engine_envs.ensure('small', print))",
        ]
    )


def child_env(cache: Path) -> dict[str, str]:
    """No database: the child only installs."""
    return {
        **os.environ,
        "MSHIP_ENGINE_ENVS_DIR": str(cache),
        "DJANGO_SETTINGS_MODULE": "modelship_site.settings",
    }


def test_it_installs_once_when_two_clones_install_the_same_family_at_once(
    cache: Path,
) -> None:
    """Two processes (two clones, two gateways) ask for the same environment together: one
    installs, the other waits on the lock and uses it."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", in_child()],
            env=child_env(cache),
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [child.communicate(timeout=300)[0] for child in children]
    assert all(child.returncode == 0 for child in children)
    assert sum("installing the small engine environment" in out for out in outputs) == 1
    pythons = {out.strip().splitlines()[-1] for out in outputs}
    assert pythons == {engine_envs.python("small")}
    assert [p.name for p in engine_envs.cached()] == [engine_envs.location("small").name]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB file system: room for the environment, not for numpy in it."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(disk)], check=True)
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_it_fails_an_install_on_a_full_disk_in_the_installers_words(
    cache: Path, site: Any, small_disk: Path
) -> None:
    (engine_envs.REQUIREMENTS_DIR / "small.txt").write_text("numpy==2.4.6\n")
    site.MSHIP_ENGINE_ENVS_DIR = small_disk
    with pytest.raises(engine_envs.EnvFailed) as failed:
        engine_envs.ensure("small")
    assert "could not be installed: uv exited with code" in str(failed.value)
    assert "No space left on device" in str(failed.value)  # uv's own words
    assert not engine_envs.location("small").exists()  # no half environment
    assert [p.name for p in small_disk.iterdir() if not p.name.endswith((".lock", ".log"))] == []


def test_it_installs_with_pip_where_uv_cannot_run(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # No uv beside this Python nor on PATH: pip, said once.
    monkeypatch.setattr(installer, "uv_binary", lambda python=sys.executable: None)
    installer.installer.cache_clear()
    try:
        heard: list[str] = []
        python = engine_envs.ensure("small", heard.append)
        assert "with pip" in heard[0] and imports_termcolor(python)
        assert "uv pip" not in Path(f"{engine_envs.location('small')}.log").read_text()
        assert capfd.readouterr().err.count("uv does not run here; installing with pip") == 1
        # Forced to uv where there is none: the start fails and says why.
        monkeypatch.setenv("MSHIP_INSTALLER", "uv")
        installer.installer.cache_clear()
        (engine_envs.REQUIREMENTS_DIR / "small.txt").write_text(SMALL + "# another\n")
        with pytest.raises(engine_envs.EnvFailed, match="MSHIP_INSTALLER=uv, but no uv runs"):
            engine_envs.ensure("small")
    finally:
        installer.installer.cache_clear()


def test_it_gives_uv_the_indexes_pip_is_configured_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site's mirror in pip.conf, and a PIP_ variable over it, reach uv as flags."""
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nindex-url = https://mirror.example/simple\n"
        "extra-index-url = https://a.example/simple https://b.example/simple\n"
    )
    for name in [n for n in os.environ if n.startswith(("PIP_", "UV_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "wheels"))
    installer.pip_settings.cache_clear()
    try:
        args = installer.uv_index_args(sys.executable)
        assert args[args.index("--index-url") + 1] == "https://mirror.example/simple"
        assert [args[i + 1] for i, a in enumerate(args) if a == "--extra-index-url"] == [
            "https://a.example/simple",
            "https://b.example/simple",
        ]
        assert args[args.index("--find-links") + 1] == str(tmp_path / "wheels")
        assert args[-2:] == ["--index-strategy", "unsafe-best-match"]
        # uv's own configuration, where an operator set one, stands.
        monkeypatch.setenv("UV_INDEX_URL", "https://uv.example/simple")
        assert installer.uv_index_args(sys.executable) == []
    finally:
        installer.pip_settings.cache_clear()


@pytest.mark.django_db
def test_it_lists_and_prunes_the_cache_from_manage_py(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine_envs.ensure("small")
    kept = engine_envs.location("small")
    # What an older requirements file and the layout before content addressing left.
    stale = cache / "small-0123456789abcdef"
    shutil.copytree(kept, stale, symlinks=True)
    old_layout = cache / "piper"
    old_layout.mkdir()
    (old_layout / "pyvenv.cfg").write_text("home = /usr/bin\n")
    call_command("engine_env", "list")
    listed = capsys.readouterr().out
    assert f"cache: {cache}" in listed
    line = next(row for row in listed.splitlines() if row.startswith("small\t"))
    state, size, _, path = line.split("\t")[1:]
    assert state == "ready" and size.endswith(" MiB") and path == str(kept)
    assert "-\tnot named (prune)\t" in listed and str(stale) in listed
    call_command("engine_env", "prune", "--dry-run")
    assert f"would remove {stale}" in capsys.readouterr().out and stale.exists()
    call_command("engine_env", "prune", "--unused-days", "1")  # just used: kept
    assert stale.exists()
    call_command("engine_env", "prune")
    out = capsys.readouterr().out
    assert f"removed {stale}" in out and f"removed {old_layout}" in out
    assert not stale.exists() and not old_layout.exists() and engine_envs.ready("small")


def test_it_installs_every_family_this_host_runs_and_names_the_ones_that_failed(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    requirements = engine_envs.REQUIREMENTS_DIR
    ours = vllm.host_family()
    other = next(family for family in vllm.FAMILIES if family != ours)
    (requirements / f"{ours}.txt").write_text(SMALL)
    (requirements / f"{other}.txt").write_text(SMALL + "# the other build\n")
    (requirements / "broken.txt").write_text("modelship-no-such-package==0.0.1\n")
    monkeypatch.setattr(engine_envs, "PLUGINS_DIR", tmp_path / "no-plugins")
    with pytest.raises(CommandError, match=r"^not installed: broken \(each one's words above\)$"):
        call_command("engine_env", "install", "--all", "--jobs", "3")
    said = capsys.readouterr()
    # Every family but the failed one is ready, each saying how long it took; of vLLM's two
    # builds only this host's is made.
    assert engine_envs.ready("small") and engine_envs.ready(ours) and not engine_envs.ready(other)
    assert re.search(rf"^{re.escape(ours)}: ready in [0-9.]+ s$", said.out, re.M)
    assert not re.search(rf"^{re.escape(other)}: ", said.out + said.err, re.M)
    # The failure in the installer's own words, and no half environment left.
    assert "broken: the broken engine environment" in said.err
    assert "modelship-no-such-package" in said.err
    assert not engine_envs.location("broken").exists()
    with pytest.raises(CommandError, match="install --all takes no family"):
        call_command("engine_env", "install", "small", "--all")
    with pytest.raises(CommandError, match="--jobs must be at least 1"):
        call_command("engine_env", "install", "--all", "--jobs", "0")
