"""The start-up gate: one start's claim on memory at a time on a host (a file lock), and on
PostgreSQL across the site's hosts too (an advisory lock), dropped when its holder dies.
Engines load side by side, outside it; so does an engine environment's install: another
model starts meanwhile, and the requests waiting for the install are told."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.db import connection

from deployments import deployer, engine_envs, launch
from deployments.adoption import adopt_all
from deployments.gate import start_gate
from deployments.models import Deployment, State
from tests.conftest import REPO, env_for_subprocess, in_thread, wait_until
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path
    from typing import TextIO

# Another process takes the gate, says so, holds it until its stdin closes.
TAKER = """
import sys, django
django.setup()
from deployments.gate import start_gate
with start_gate():
    print("taken", flush=True)
    sys.stdin.read()
"""


pytestmark = [pytest.mark.postgres]


class Taker:
    """Another process that takes the gate, and holds it until `release`."""

    def __init__(self, run_dir: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", TAKER],
            cwd=REPO,
            env=env_for_subprocess(MSHIP_RUN_DIR=str(run_dir)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.taken = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() == "taken":
            self.taken.set()

    def release(self) -> None:
        self.process.communicate("")


def test_it_lets_one_start_at_a_time_on_a_host(transactional_db: None, site: Any) -> None:
    with start_gate():
        other = Taker(site.MSHIP_RUN_DIR)
        assert not other.taken.wait(2)
    try:
        assert other.taken.wait(30)
    finally:
        other.release()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="one host's gate on SQLite")
def test_it_lets_one_start_at_a_time_across_hosts_on_postgresql(
    transactional_db: None, site: Any, tmp_path: Path
) -> None:
    with start_gate():
        # Another host: its own run folder (file lock), the same database.
        elsewhere = Taker(tmp_path / "other-host")
        assert not elsewhere.taken.wait(2)
    assert elsewhere.taken.wait(30)
    # Its holder killed while holding it: the database drops the lock with its connection.
    elsewhere.process.kill()
    elsewhere.process.wait()
    again = Taker(tmp_path / "third-host")
    try:
        assert again.taken.wait(30)
    finally:
        again.release()


class HeldInstall:
    """The engine family `held`, whose install (engine_envs.build) waits until the test lets
    it go, then leaves a stand-in environment: this Python, stamped as a whole one."""

    def __init__(self) -> None:
        self.began = threading.Event()
        self.release = threading.Event()
        self.builds = 0

    def build(self, family: str, target: Path, log: TextIO) -> None:
        self.builds += 1
        self.began.set()
        self.release.wait(60)
        (target / "bin").mkdir(parents=True)
        (target / "bin" / "python").symlink_to(sys.executable)
        (target / engine_envs.MANIFEST).write_text("")
        (target / engine_envs.READY).write_text(f"{family}\n")


@pytest.fixture
def held_install(
    site: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[HeldInstall]:
    """Deployments named painter* need the family `held` (the simulated engine, which runs
    on Modelship's Python, needs none otherwise); its install is the test's to release."""
    requirements = tmp_path / "requirements"
    requirements.mkdir()
    (requirements / "held.txt").write_text("termcolor==3.3.0\n")
    monkeypatch.setattr(engine_envs, "REQUIREMENTS_DIR", requirements)
    site.MSHIP_ENGINE_ENVS_DIR = tmp_path / "engines"
    held = HeldInstall()
    monkeypatch.setattr(engine_envs, "build", held.build)
    family_of: Callable[[Deployment], str | None] = launch.family_of
    monkeypatch.setattr(
        launch, "family_of", lambda d: "held" if d.name.startswith("painter") else family_of(d)
    )
    yield held
    held.release.set()  # a test that failed half-way leaves no install waiting


@pytest.mark.usefixtures("engines")
def test_it_starts_a_model_while_another_deployments_engine_installs(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, held_install: HeldInstall
) -> None:
    site_key = api_key()
    fields = {"mode": "on_demand", "idle_timeout_s": 60}
    painter = make_deployment("painter", config={"reply": "painted"}, **fields)
    make_deployment("chat", config={"reply": "chatted"}, **fields)
    seen_by_gateway(lambda s: {"painter", "chat"} <= set(s.routes))
    lines: queue.Queue[str] = queue.Queue()

    def paint() -> None:
        body = {"model": "painter", "messages": [{"role": "user", "content": "x"}], "stream": True}
        headers = {"authorization": f"Bearer {site_key}"}
        url = gateway_url + "/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as answer:
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    lines.put(line.removeprefix("data: "))

    painting = in_thread(paint)
    assert held_install.began.wait(30)
    # The request waiting for the install is told so, and the row says it.
    told = json.loads(lines.get(timeout=30))
    assert told["id"] == "ondemand-queued"
    assert told["choices"][0]["delta"]["content"].startswith(
        "[painter is installing its engine environment (held) before it can start;"
    )
    painter.refresh_from_db()
    assert painter.state_reason.startswith("installing the held engine environment with ")
    # Another model starts and answers meanwhile: the install holds no gate and no lock.
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=site_key, max_retries=0)
    chatted = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}]
    )
    assert chatted.choices[0].message.content == "chatted"
    assert painting.is_alive() and not held_install.release.is_set()
    held_install.release.set()
    painting.join(60)
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    assert rest[-1] == "[DONE]"
    chunks = [json.loads(line) for line in rest[:-1]]
    text = "".join(c["delta"].get("content") or "" for chunk in chunks for c in chunk["choices"])
    assert text == "painted"
    assert Deployment.objects.get(pk=painter.pk).state == State.READY


@pytest.mark.usefixtures("engines")
def test_it_installs_a_family_once_for_two_starts_at_once(
    make_deployment: Any, held_install: HeldInstall
) -> None:
    first, second = make_deployment("painter-1"), make_deployment("painter-2")
    starts = [in_thread(deployer.restart, first.pk)]
    assert held_install.began.wait(30)
    starts.append(in_thread(deployer.restart, second.pk))
    waiting = "waiting for the held engine environment: another install of it is under way"
    wait_until(lambda: Deployment.objects.get(pk=second.pk).state_reason == waiting)
    held_install.release.set()
    for start in starts:
        start.join(60)
    assert [Deployment.objects.get(pk=d.pk).state for d in (first, second)] == [State.READY] * 2
    assert held_install.builds == 1


@pytest.mark.usefixtures("engines")
def test_it_starts_on_the_environment_of_the_configuration_it_starts(
    make_deployment: Any, held_install: HeldInstall, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configuration changed while its start installed (outside the gate) to one of
    another engine family: that family is installed before the engine launches, not
    launched on an environment that is not there."""
    (engine_envs.REQUIREMENTS_DIR / "other.txt").write_text("termcolor==3.3.0\n")
    held_family = launch.family_of
    monkeypatch.setattr(
        launch,
        "family_of",
        lambda d: "other" if (d.config or {}).get("reply") == "other" else held_family(d),
    )
    painter = make_deployment("painter", config={"reply": "held"})
    start = in_thread(deployer.restart, painter.pk)
    assert held_install.began.wait(30)
    Deployment.objects.filter(pk=painter.pk).update(config={"reply": "other"})
    held_install.release.set()
    start.join(60)
    painter.refresh_from_db()
    assert painter.state == State.READY, painter.state_reason
    assert held_install.builds == 2  # held, then other
    assert engine_envs.ready("other")


def both_starting(first: Deployment, second: Deployment) -> bool:
    states = dict(
        Deployment.objects.filter(pk__in=[first.pk, second.pk]).values_list("pk", "state")
    )
    return states == {first.pk: State.STARTING, second.pk: State.STARTING}


@pytest.mark.usefixtures("engines")
def test_it_waits_for_two_engines_at_once_and_lets_one_of_two_claim_the_last_room(
    make_deployment: Any, site: Any
) -> None:
    """The gate covers a start's claim on memory, not its engine's health wait: two models
    of 3 GiB on 8 GiB are starting at the same moment; then two of 5 GiB race for the room
    left, and one passes the fit check while the other is refused."""
    slow = {"startup_delay_s": 3}
    first, second = make_deployment("first", config=slow), make_deployment("second", config=slow)
    for deployment in (first, second):
        deployment.memory_gib = 3.0
        deployment.save(update_fields=["memory_gib"])
    starts = [in_thread(deployer.restart, d.pk) for d in (first, second)]
    wait_until(lambda: both_starting(first, second), 10)
    for start in starts:
        start.join(60)
    assert {d.state for d in Deployment.objects.filter(pk__in=[first.pk, second.pk])} == {
        State.READY
    }
    deployer.stop(first.pk)
    deployer.stop(second.pk)
    racers = [make_deployment(f"racer-{n}", memory_gib=5.0, config=slow) for n in range(2)]
    refused: list[Exception] = []

    def race(pk: int) -> None:
        try:
            deployer.restart(pk)
        except deployer.InsufficientMemory as exc:
            refused.append(exc)

    threads = [in_thread(race, r.pk) for r in racers]
    for thread in threads:
        thread.join(60)
    states = sorted(
        Deployment.objects.filter(name__startswith="racer").values_list("state", flat=True)
    )
    assert len(refused) == 1 and states == sorted([State.READY, State.PLANNED])


@pytest.mark.usefixtures("engines")
def test_it_has_adoption_wait_for_a_start_under_way(make_deployment: Any, site: Any) -> None:
    """A row marked starting whose engine is still loading is no interrupted start: adoption
    (serve's start, adopt_engines) waits for it instead of stopping it."""
    loading = make_deployment("loading", config={"startup_delay_s": 2})
    start = in_thread(deployer.restart, loading.pk)
    wait_until(lambda: Deployment.objects.get(pk=loading.pk).state == State.STARTING, 10)
    outcome = adopt_all()
    start.join(60)
    assert loading.name not in outcome["stopped"]
    assert Deployment.objects.get(pk=loading.pk).state == State.READY
