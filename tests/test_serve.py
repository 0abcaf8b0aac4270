"""`make run`'s command: server and cluster together, example deployments, clean Ctrl-C."""

from __future__ import annotations

import io
import re
import signal
import socket
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.core.management import CommandError, call_command
from django_q.conf import Conf

from deployments.management.commands.ensure_admin import ensure_admin
from deployments.models import Deployment, State
from deployments.runtimes.process import free_port
from modelship_site.management.commands.serve import Command
from modelship_site.workers import AUTO_CAP, worker_count
from openai_api.models import ApiKey
from tests.conftest import REPO, answers, env_for_subprocess, pid_alive, reply_of, wait_until

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("engines")


def test_it_serves_the_examples_and_stops_every_engine_on_ctrl_c(site: Any, tmp_path: Path) -> None:
    call_command("fetch_example_model", "smollm2", "--into", str(REPO / "var/models"))
    for name, flags in (
        ("tiny-embed.gguf", ["--embedding"]),
        ("tiny-whisper.bin", ["--kind", "whisper"]),
    ):  # as `make run` does
        out = str(REPO / f"var/models/{name}")
        call_command("make_tiny_model", out, "--if-missing", *flags)
    port = free_port("127.0.0.1")
    serve = serve_process(site, tmp_path, port, "examples/models.yaml")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: answers(base + "/health"), 60)
        wait_until(lambda: httpx.get(base + "/readyz").status_code == 200, 60)
        token = (tmp_path / "var" / "admin_token").read_text().strip()
        assert (tmp_path / "var" / "admin_token").stat().st_mode & 0o77 == 0

        def states() -> dict[str, str]:
            listed = httpx.get(
                base + "/api/deployments/", headers={"authorization": f"Token {token}"}
            ).json()
            return {d["name"]: d["state"] for d in listed["results"]}

        # The voice's and the transcriber's first starts may install their environments.
        wait_until(
            lambda: all(states().get(n) not in ("planned", "starting") for n in ("voice", "ears")),
            300,
        )
        assert states() == {
            "sim-chat": "ready",
            "tiny-embed": "ready",
            "chat": "planned",
            "voice": "ready",
            "ears": "ready",
        }
        assert reply_of(Deployment.objects.get(name="sim-chat").engine_url)
        login = httpx.get(base + "/admin/login/")
        assert login.status_code == 200 and "Modelship" in login.text
        # The printed key works with the openai SDK, through daphne.
        key = (tmp_path / "var" / "api_key").read_text().strip()
        assert f"with the key {key}" in (tmp_path / "serve.log").read_text()
        sdk = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60)
        assert {m.id for m in sdk.models.list()} >= {"sim-chat", "chat", "smollm2", "tiny-embed"}
        stream = sdk.chat.completions.create(
            model="sim-chat", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        # The real model: embeddings from llama.cpp, always on.
        vectors = sdk.embeddings.create(model="tiny-embed", input=["a", "b"]).data
        assert len(vectors) == 2 and len(vectors[0].embedding) == 64
        # The real voice, in OpenAI's default format (mp3).
        speech = sdk.audio.speech.create(model="voice", voice="alloy", input="Hello.")
        assert speech.response.headers["content-type"] == "audio/mpeg" and speech.content
        # Real transcription of it (of nonsense words: the model is tiny and random).
        heard = sdk.audio.transcriptions.create(
            model="whisper-1", file=("hello.mp3", speech.content)
        )
        assert isinstance(heard.text, str)
        # The on-demand gateway's key was made for LiteLLM; this machine is no peer of it.
        key_file = tmp_path / "var" / "ondemand_key"
        assert key_file.read_text().startswith("odk-") and key_file.stat().st_mode & 0o77 == 0
        refused = httpx.get(f"{base}/ondemand/1/v1/models")
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
        # The README's first call: the real instruct model (SmolLM2), on demand, started by it.
        question = "What is the capital of France? Answer in one word."
        answer = sdk.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": question}],
            max_tokens=32,
            temperature=0,
            timeout=300,  # its start and a loaded two-core host
        )
        assert "Paris" in (answer.choices[0].message.content or "")
        assert answer.choices[0].finish_reason == "stop"
        assert Deployment.objects.get(name="chat").state == State.READY
        pids = [
            h["pid"]
            for d in Deployment.objects.filter(state=State.READY)
            for h in d.runtime_handle["replicas"]
        ]
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(60)
    assert serve.returncode == 0, (tmp_path / "serve.log").read_text()
    assert pids and not any(pid_alive(pid) for pid in pids)
    assert not answers(base + "/health")
    stopped = Deployment.objects.filter(name__in=["sim-chat", "tiny-embed"])
    assert {(d.state, d.state_reason) for d in stopped} == {(State.STOPPED, "Modelship shut down")}
    printed = (tmp_path / "serve.log").read_text()
    password = (tmp_path / "var" / "admin_password").read_text().strip()
    assert f"Sign in as 'admin' with password '{password}'" in printed  # made by this run


def test_it_prints_secrets_only_when_it_makes_them_and_keeps_a_revoked_key_revoked(
    transactional_db: None, settings: Any, tmp_path: Path
) -> None:

    settings.VAR_DIR = tmp_path / "var"

    def start() -> str:  # what one `serve` start prints about credentials
        out = io.StringIO()
        Command(stdout=out).say_credentials("http://x", ensure_admin())
        return out.getvalue()

    first = start()
    password = (tmp_path / "var" / "admin_password").read_text().strip()
    key = (tmp_path / "var" / "api_key").read_text().strip()
    assert password in first and key in first
    for name in ("admin_password", "api_key", "admin_token"):
        assert (tmp_path / "var" / name).stat().st_mode & 0o777 == 0o600
    second = start()
    assert password not in second and key not in second and "var/api_key" in second
    ApiKey.objects.filter(name="make-run").update(revoked=True)
    third = start()
    assert "was revoked" in third and ApiKey.objects.filter(revoked=False).count() == 0
    assert (tmp_path / "var" / "api_key").read_text().strip() == key  # not replaced


def serve_process(
    site: Any, tmp_path: Path, port: int, models: str, *options: str
) -> subprocess.Popen[bytes]:
    env = env_for_subprocess(
        MSHIP_VAR_DIR=str(tmp_path / "var"),
        MSHIP_RUN_DIR=str(site.MSHIP_RUN_DIR),
        MSHIP_ENGINE_LOG_DIR=str(site.MSHIP_ENGINE_LOG_DIR),
        MSHIP_MEMORY_CAPACITY_GIB="8",
        MSHIP_Q_NAME=Conf.PREFIX,
    )
    return subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--models", models, *options],
        cwd=REPO,
        env=env,
        stdout=(tmp_path / "serve.log").open("wb"),
        stderr=subprocess.STDOUT,
    )


def test_it_keeps_serving_when_the_models_file_is_broken(site: Any, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("models:\n  - name: x\n    loader: nope\n")
    port = free_port("127.0.0.1")
    serve = serve_process(site, tmp_path, port, str(broken))
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/health"), 60)
        wait_until(lambda: "nothing was changed" in (tmp_path / "serve.log").read_text(), 30)
    finally:
        serve.send_signal(signal.SIGINT)
        serve.wait(60)
    printed = (tmp_path / "serve.log").read_text()
    assert "models[0] (x): 'model' is required" in printed
    assert serve.returncode == 0
    assert not Deployment.objects.exists()


@pytest.mark.parametrize(
    ("workers", "shared"),
    [("1", False), ("2", False), ("2", True)],
    ids=["one-worker", "workers", "workers-on-a-shared-port"],
)
def test_it_stops_everything_when_the_server_cannot_start(
    site: Any, tmp_path: Path, workers: str, shared: bool
) -> None:
    """A port someone holds is taken, even one held with SO_REUSEPORT, which the sockets of
    `--workers` would otherwise share with it."""
    with socket.socket() as taken:
        if shared:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        serve = serve_process(site, tmp_path, port, "examples/models.yaml", "--workers", workers)
        serve.wait(90)
    printed = (tmp_path / "serve.log").read_text()
    assert serve.returncode == 1, printed
    assert f"Modelship stopped: cannot listen on 127.0.0.1:{port}: " in printed, printed
    # It stopped before it started anything.
    assert not Deployment.objects.filter(state__in=[State.READY, State.STARTING]).exists()


@pytest.mark.parametrize(
    ("asked", "server", "cores", "workers"),
    [
        ("auto", "uvicorn", 2, 1),  # two cores: the engines and the load need the other
        ("auto", "uvicorn", 1, 1),
        ("auto", "uvicorn", 8, 8),
        ("AUTO", "uvicorn", 64, AUTO_CAP),
        ("auto", "daphne", 8, 1),
        ("3", "uvicorn", 2, 3),  # a number is taken as it is
    ],
)
def test_it_runs_one_worker_per_core_for_auto_past_two_cores(
    asked: str, server: str, cores: int, workers: int
) -> None:
    assert worker_count(asked, server, cores) == workers


@pytest.mark.parametrize(
    ("asked", "server", "said"),
    [
        ("0", "uvicorn", "--workers takes 1 or more"),
        ("-2", "uvicorn", "--workers takes 1 or more"),
        ("many", "uvicorn", "--workers takes a number or 'auto', not 'many'"),
        ("2", "daphne", "more than 1 worker runs with uvicorn only"),
    ],
)
def test_it_refuses_workers_it_cannot_run_before_it_starts_anything(
    asked: str, server: str, said: str, site: Any, db: None
) -> None:
    with pytest.raises(CommandError, match=re.escape(said)):
        call_command(
            "serve", "--workers", asked, "--server", server, "--models", "examples/models.yaml"
        )
    assert not Deployment.objects.exists()  # the examples were not deployed
