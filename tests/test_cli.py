"""`modelship`, the operator's command line, against a live Modelship (`manage.py serve`):
ps, deploy --wait, logs and logs -f, run, start and stop, keys; exit codes a script uses."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import select
import subprocess
from pathlib import Path
from typing import IO, TYPE_CHECKING

import httpx
import pytest

from deployments.runtimes.process import free_port
from openai_api.models import ApiKey
from tests.conftest import REPO, wait_until

if TYPE_CHECKING:
    from collections.abc import Iterator

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
    env: dict[str, str], *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / ".venv/bin/modelship"), *args],
        env={**env, "COLUMNS": "160"},
        input=stdin,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@contextlib.contextmanager
def running(env: dict[str, str], *args: str) -> Iterator[tuple[IO[str], IO[str]]]:
    """`modelship ARGS` left running (it follows), its output and errors read line by line;
    stopped after the block."""
    process = subprocess.Popen(
        [str(REPO / ".venv/bin/modelship"), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None and process.stderr is not None
        yield process.stdout, process.stderr
    finally:
        process.terminate()
        process.wait(10)


def test_it_deploys_lists_follows_runs_and_operates_through_the_api(
    live: dict[str, str], tmp_path: Path
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(MODELS)
    deployed = cli(live, "deploy", "-f", str(models), "--wait")
    assert deployed.returncode == 0, deployed.stderr
    assert "created: talker, napper" in deployed.stdout
    assert "talker: ready" in deployed.stdout

    listed = cli(live, "ps", "-a")
    assert listed.returncode == 0, listed.stderr
    header, *rows, host = listed.stdout.splitlines()
    assert header.split() == [
        "NAME",
        "STATE",
        "SINCE",
        "MODE",
        "MODEL",
        "GPUS",
        "MEMORY",
        "IN",
        "FLIGHT",
        "QUEUED",
        "IDLE",
        "UNTIL",
    ]
    by_name = {row.split()[0]: row.split() for row in rows}
    assert by_name["talker"][1] == "ready" and by_name["talker"][3:6] == [
        "always",
        "on",
        "simulated:",
    ]
    assert re.fullmatch(r"\d+[smhd]", by_name["talker"][2])  # how long it has been ready
    assert by_name["napper"][1] in ("planned", "stopped")
    assert by_name["napper"][2:4] == ["·", "idle"]  # the admin's words: on demand, no engine
    assert host.startswith("host: 1 of 8 GiB held · on demand may use 7 GiB")
    # Without -a, like docker's: nothing that is stopped or planned.
    assert {r.split()[0] for r in cli(live, "ps").stdout.splitlines()[1:-1]} == {"talker"}
    records = json.loads(cli(live, "ps", "--json", "-a").stdout)
    as_json = {r["name"]: r for r in records}
    assert as_json["napper"]["mode"] == "on_demand" and as_json["talker"]["need_gib"] == 1.0
    assert as_json["talker"]["in_flight"] is None and isinstance(
        as_json["talker"]["in_state_s"], int
    )
    assert set(as_json["talker"]) == {
        "name",
        "state",
        "state_label",
        "state_since",
        "in_state_s",
        "mode",
        "loader",
        "model",
        "gpus",
        "need_gib",
        "in_flight",
        "queued",
        "queue_place",
        "ready_in_s",
        "idle_left_s",
        "reason",
    }

    # logs -f prints what the log holds (so far, the engine's start), then follows the
    # engine as it prints (one line per request it serves).
    with running(live, "logs", "talker", "-f") as (follower, notes):
        assert "(following talker, replica 0)" in notes.readline()
        started = follower.readline()
        assert started.startswith("=== ") and "--served-model-name talker" in started
        served = "POST /v1/chat/completions"
        followed: list[str] = []
        for _ in range(5):  # the engine's log may be opened just after the stream
            answer = cli(live, "run", "talker", "hello")
            assert answer.returncode == 0, answer.stderr
            assert answer.stdout.strip() == "the quick brown fox"
            while served not in followed and select.select([follower], [], [], 3)[0]:
                followed.append(follower.readline().strip())
            if served in followed:
                break
        assert served in followed, followed
    tail = cli(live, "logs", "talker", "-n", "5")
    assert "POST /v1/chat/completions" in tail.stdout
    # -f -n N: the last N lines at once, then it follows.
    with running(live, "logs", "talker", "-f", "-n", "1") as (caught_up, notes):
        assert caught_up.readline().strip() == "POST /v1/chat/completions"
        assert "(following talker, replica 0)" in notes.readline()

    # run starts an on-demand model; the prompt may come on stdin.
    woke = cli(live, "run", "napper", stdin="wake up")
    assert woke.returncode == 0 and woke.stdout.strip(), woke.stderr
    napping = {r["name"]: r for r in json.loads(cli(live, "ps", "--json").stdout)}["napper"]
    assert napping["state"] == "ready" and napping["in_flight"] == 0
    assert 240 <= napping["idle_left_s"] <= 300, napping
    shown = {r.split()[0]: r for r in cli(live, "ps", "--running").stdout.splitlines()[1:-1]}
    assert re.search(r" in [45]m\d\ds\s*$", shown["napper"]), shown
    assert cli(live, "stop", "napper", "--wait").returncode == 0
    assert "napper" not in cli(live, "ps").stdout
    stopped = {r["name"]: r["state"] for r in json.loads(cli(live, "ps", "-a", "--json").stdout)}
    assert stopped["napper"] == "stopped"

    # describe: what the change page shows, then its events, oldest first.
    described = cli(live, "describe", "napper")
    assert described.returncode == 0, described.stderr
    lines = described.stdout.splitlines()
    fields = dict(re.findall(r"^([A-Z][^:]*):\s+(.*)$", described.stdout, re.M))
    assert (fields["Name"], fields["State"], fields["Mode"]) == (
        "napper",
        "stopped · idle",
        "on demand",
    )
    assert fields["Loader"] == "simulated" and fields["Memory (GiB)"] == "1.0"
    kinds = [line.split()[3] for line in lines[lines.index("Events:") + 1 :]]
    assert kinds == ["starting", "ready", "stopping", "stopped"], kinds
    as_json = json.loads(cli(live, "describe", "napper", "--json").stdout)
    assert as_json["name"] == "napper" and as_json["events"][0]["kind"] == "stopped"

    # events -f: the latest, then each new one as it happens.
    with running(live, "events", "napper", "-f", "-n", "1") as (watcher, _):
        assert watcher.readline().split()[2:4] == ["napper", "stopped"]
        assert cli(live, "start", "napper", "--wait").returncode == 0
        happened = [watcher.readline().split()[3] for _ in range(2)]
        assert happened == ["starting", "ready"], happened


def test_it_manages_keys_and_exits_with_codes_a_script_can_use(
    live: dict[str, str], tmp_path: Path
) -> None:
    made = cli(live, "keys", "create", "ci", "--models", "talker", "--rpm", "30")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    key = ApiKey.objects.get(name="ci")
    assert secret.startswith(f"msk-{key.prefix}-") and key.allowed_models == ["talker"]
    assert key.requests_per_minute == 30
    site_secret = (Path(live["MSHIP_VAR_DIR"]) / "api_key").read_text().strip()
    bearer = {"authorization": f"Bearer {site_secret}"}
    assert httpx.get(live["MSHIP_URL"] + "/v1/models", headers=bearer).status_code == 200
    wait_until(lambda: ApiKey.objects.filter(last_used__isnull=False).exists(), 10)
    header, *rows = cli(live, "keys", "list").stdout.splitlines()
    assert header.split("\t") == ["ID", "PREFIX", "NAME", "STATE", "MODELS", "RATE", "LAST USED"]
    listed = {row.split("\t")[2]: row.split("\t")[3:] for row in rows}
    assert listed["ci"] == ["active", "talker", "30/min (key)", "never"]
    site_key = next(name for name in listed if name != "ci")
    assert listed[site_key][2] == "6000/min (site default)"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", listed[site_key][3])
    assert secret not in "\n".join(rows)
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


def test_it_finds_its_credentials_from_any_directory_and_says_where_it_looked(
    live: dict[str, str], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    url = live["MSHIP_URL"]
    var = Path(live["MSHIP_VAR_DIR"])
    token = (var / "admin_token").read_text().strip()
    config = tmp_path / "config"
    bare = {k: v for k, v in live.items() if not k.startswith("MSHIP_") or k == "MSHIP_Q_NAME"}
    bare["XDG_CONFIG_HOME"] = str(config)
    elsewhere = tmp_path_factory.mktemp("elsewhere")  # not under the site
    inside = var.parent / "deep" / "inside"
    inside.mkdir(parents=True)

    lost = cli({**bare, "MODELSHIP_URL": url}, "ps", cwd=elsewhere)
    assert lost.returncode == 3
    assert "no token: tried MODELSHIP_TOKEN, MSHIP_TOKEN, " in lost.stderr
    assert str(config / "modelship" / "credentials.json") in lost.stderr
    assert "`modelship login` saves one" in lost.stderr
    # In the site's folder: its var/, as `make run` left it (not in a folder under it).
    assert cli({**bare, "MODELSHIP_URL": url}, "ps", cwd=var.parent).returncode == 0
    below = cli({**bare, "MODELSHIP_URL": url}, "ps", cwd=inside)
    assert below.returncode == 3 and str(inside / "var" / "admin_token") in below.stderr
    # The environment, by Modelship's name.
    denied = cli({**bare, "MODELSHIP_URL": url, "MODELSHIP_TOKEN": "nope"}, "ps", cwd=elsewhere)
    assert denied.returncode == 3 and "(the token from MODELSHIP_TOKEN)" in denied.stderr
    # `modelship login` checks the token, then saves it for every directory, for its owner.
    (tmp_path / "nope").write_text("nope\n")
    refused = cli(bare, "login", url, "--token-file", str(tmp_path / "nope"), cwd=elsewhere)
    assert refused.returncode == 3 and not (config / "modelship").exists()
    logged = cli(bare, "login", url, stdin=token + "\n", cwd=elsewhere)
    assert logged.returncode == 0, logged.stderr
    saved = config / "modelship" / "credentials.json"
    assert f"logged in to {url}" in logged.stdout
    assert json.loads(saved.read_text()) == {"url": url, "token": token}
    assert saved.stat().st_mode & 0o777 == 0o600
    listed = cli(bare, "ps", "--json", cwd=elsewhere)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []


MEDIA = """
models:
  - name: vectors
    model: simulated
    loader: simulated
    usecase: embed
    runtime: process
    memory_gib: 1
  - name: ears
    model: simulated
    loader: simulated
    usecase: transcription
    runtime: process
    memory_gib: 1
  - name: voice
    model: espeak
    loader: tts
    usecase: tts
    runtime: process
    memory_gib: 0.3
"""


def test_it_runs_a_model_as_its_use_case_has_it(live: dict[str, str], tmp_path: Path) -> None:
    """`modelship run` embeds, transcribes a file and writes speech to one, as it chats (an
    image model's is in test_images)."""
    models = tmp_path / "media.yaml"
    models.write_text(MEDIA)
    deployed = cli(live, "deploy", "-f", str(models), "--wait")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    vector = cli(live, "run", "vectors", "a sentence to embed")
    assert vector.returncode == 0, vector.stderr
    assert all(isinstance(x, float) for x in json.loads(vector.stdout)) and json.loads(
        vector.stdout
    )

    recording = tmp_path / "hello.wav"
    recording.write_bytes(b"RIFF" + bytes(range(256)) * 4)
    heard = cli(live, "run", "ears", str(recording))
    digest = hashlib.sha256(recording.read_bytes()).hexdigest()
    assert heard.returncode == 0 and heard.stdout.strip() == f"1028 bytes sha256={digest}"
    no_file = cli(live, "run", "ears")
    assert no_file.returncode == 1 and "ears takes an audio file" in no_file.stderr
    absent = cli(live, "run", "ears", str(tmp_path / "absent.wav"))
    assert absent.returncode == 2 and "absent.wav" in absent.stderr

    spoken = cli(live, "run", "voice", "hello there", "-o", str(tmp_path / "hello-out.wav"))
    assert spoken.returncode == 0, spoken.stderr
    assert "wrote" in spoken.stdout and (tmp_path / "hello-out.wav").read_bytes()[:4] == b"RIFF"
    nowhere = cli(live, "run", "voice", "hi", "-o", str(tmp_path / "no" / "such" / "x.wav"))
    assert nowhere.returncode == 1 and "x.wav" in nowhere.stderr
