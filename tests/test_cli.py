"""`modelship`, the operator's command line, against a live Modelship (`manage.py serve`):
ps, deploy --wait, logs and logs -f, run, start and stop, keys; exit codes a script uses."""

from __future__ import annotations

import json
import re
import select
import subprocess
from typing import TYPE_CHECKING

import pytest

from deployments.runtimes.process import free_port
from openai_api.models import ApiKey
from tests.conftest import REPO

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")

MODELS = """
models:
  - name: talker
    model: simulated
    loader: simulated
    runtime: process
    memory_gib: 1
    simulated_config: {reply: "the quick brown fox", tokens_per_second: 200}
  - name: napper
    model: simulated
    loader: simulated
    runtime: process
    mode: on_demand
    idle_timeout_s: 300
    memory_gib: 1
"""


def cli(
    env: dict[str, str], *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / ".venv/bin/modelship"), *args],
        env={**env, "COLUMNS": "160"},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_it_deploys_lists_follows_runs_and_operates_through_the_api(
    live: dict[str, str], tmp_path: Path
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(MODELS)
    deployed = cli(live, "deploy", "-f", str(models), "--wait")
    assert deployed.returncode == 0, deployed.stderr
    assert "created: talker, napper" in deployed.stdout
    assert "talker: ready" in deployed.stdout

    listed = cli(live, "ps")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == [
        "NAME",
        "STATE",
        "MODE",
        "GPUS",
        "MEMORY",
        "IN",
        "FLIGHT",
        "QUEUED",
        "IDLE",
        "UNTIL",
    ]
    by_name = {row.split()[0]: row.split() for row in rows}
    assert by_name["talker"][1:3] == ["ready", "always"]
    assert by_name["napper"][1] in ("planned", "stopped")
    as_json = {r["NAME"]: r for r in json.loads(cli(live, "ps", "--json").stdout)}
    assert as_json["napper"]["MODE"] == "on demand" and as_json["talker"]["MEMORY"] == "1 GiB"

    # logs -f follows the engine as it prints (one line per request it serves).
    follower = subprocess.Popen(
        [str(REPO / ".venv/bin/modelship"), "logs", "talker", "-f"],
        env=live,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None and follower.stderr is not None
        assert "(following talker, replica 0)" in follower.stderr.readline()
        followed = ""
        for _ in range(5):  # the engine's log may be opened just after the stream
            answer = cli(live, "run", "talker", "hello")
            assert answer.returncode == 0, answer.stderr
            assert answer.stdout.strip() == "the quick brown fox"
            if select.select([follower.stdout], [], [], 3)[0]:
                followed = follower.stdout.readline().strip()
                break
        assert followed == "POST /v1/chat/completions"
    finally:
        follower.terminate()
        follower.wait(10)
    tail = cli(live, "logs", "talker", "-n", "5")
    assert "POST /v1/chat/completions" in tail.stdout

    # run starts an on-demand model; the prompt may come on stdin.
    woke = cli(live, "run", "napper", stdin="wake up")
    assert woke.returncode == 0 and woke.stdout.strip(), woke.stderr
    napping = {r["NAME"]: r for r in json.loads(cli(live, "ps", "--json").stdout)}["napper"]
    assert napping["STATE"] == "ready" and napping["IN FLIGHT"] == "0"
    assert re.fullmatch(r"in [45]m\d\ds", napping["IDLE UNTIL"]), napping
    assert cli(live, "stop", "napper", "--wait").returncode == 0
    assert "napper" in cli(live, "ps").stdout
    stopped = {r["NAME"]: r["STATE"] for r in json.loads(cli(live, "ps", "--json").stdout)}
    assert stopped["napper"] == "stopped"


def test_it_manages_keys_and_exits_with_codes_a_script_can_use(
    live: dict[str, str], tmp_path: Path
) -> None:
    made = cli(live, "keys", "create", "ci", "--models", "talker", "--rpm", "30")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    key = ApiKey.objects.get(name="ci")
    assert secret.startswith(f"msk-{key.prefix}-") and key.allowed_models == ["talker"]
    assert key.requests_per_minute == 30
    listed = cli(live, "keys", "list").stdout
    assert f"msk-{key.prefix}\tci\tactive\ttalker" in listed and secret not in listed
    assert cli(live, "keys", "revoke", "ci").returncode == 0
    key.refresh_from_db()
    assert key.revoked

    missing = cli(live, "start", "nobody")
    assert missing.returncode == 2 and "no deployment named 'nobody'" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("models:\n  - name: x\n    loader: nope\n")
    refused = cli(live, "deploy", "-f", str(broken))
    assert refused.returncode == 1 and "'model' is required" in refused.stderr
    assert cli(live, "deploy", "-f", str(tmp_path / "absent.yaml")).returncode == 2
    denied = cli({**live, "MSHIP_TOKEN": "not-a-token"}, "ps")
    assert denied.returncode == 3 and "not allowed" in denied.stderr
    gone = cli({**live, "MSHIP_URL": f"http://127.0.0.1:{free_port('127.0.0.1')}"}, "ps")
    assert gone.returncode == 3 and "cannot reach Modelship" in gone.stderr
