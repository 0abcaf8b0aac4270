"""The prefix cache kept across a stop, end to end on a real llama.cpp engine (the project's
tiny GGUF behind the llama_server loader): a conversation pinned to its slot, its slot saved
as the engine stops, restored for its next turn after the start (the same greedy answer,
computed from a few tokens), never for another tenant nor into a changed model, and a
damaged file served cold."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.core.management import call_command

from deployments import deployer, kv_store
from deployments.api.serializers import DeploymentSerializer
from deployments.models import Deployment, State
from modelship_cli.render import saved_text
from tests.conftest import wait_until
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("engines")
# Three whole blocks (routing/blocks.py: 512 characters) before the user's turn.
SYSTEM = "You keep the ledger of the accounts team, line by line, and answer briefly. " * 22
OTHER = "You plan the rota of the clinic's nurses, week by week, and answer briefly. " * 22


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny.gguf"
    call_command("make_tiny_model", str(path))
    return path


@pytest.fixture
def keeping(site: Any, tmp_path: Path) -> Any:
    site.VAR_DIR = tmp_path / "var"
    site.MSHIP_KV_KEEP_MIN_TOKENS = 32
    site.MSHIP_CACHE_FIGURES = "all"  # the engine's timings reach the test
    site.MSHIP_CACHE_SCOPE = "key"  # each key its own tenant
    return site


@pytest.fixture
def kept(
    keeping: Any, serving: Callable[..., Deployment], tiny_model: Path
) -> Callable[..., Deployment]:
    def start(**config: Any) -> Deployment:
        return serving(
            "keeper",
            model=str(tiny_model),
            loader="llama_server",
            mode="on_demand",
            idle_timeout_s=600,
            memory_gib=0.5,
            config={"n_ctx": 4096, "parallel": 2, "threads": 1, **config},
        )

    return start


def chat(url: str, key: str, messages: list[dict[str, str]]) -> httpx.Response:
    answer = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "keeper", "messages": messages, "max_tokens": 8, "temperature": 0},
        headers={"authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    return answer


def said(answer: httpx.Response) -> str:
    return str(answer.json()["choices"][0]["message"]["content"])


def computed(answer: httpx.Response) -> int:
    return int(answer.json()["timings"]["prompt_n"])


def conversation(
    who: str, answer: httpx.Response | None = None, system: str = SYSTEM
) -> list[dict[str, str]]:
    opening = [{"role": "system", "content": system}, {"role": "user", "content": f"I am {who}."}]
    if answer is None:
        return opening
    return [
        *opening,
        {"role": "assistant", "content": said(answer)},
        {"role": "user", "content": "And the total of the second line?"},
    ]


def restores(url: str, outcome: str) -> float:
    """The gateway's count of restores so far (its metrics outlive a test)."""
    sample = f'modelship_kv_restores_total{{deployment="keeper",outcome="{outcome}"}} '
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(sample):
            return float(line.removeprefix(sample))
    return 0.0


def restart(deployment: Deployment) -> Deployment:
    assert deployer.stop(deployment.pk, reason="a test's swap")
    deployer.restart(deployment.pk)
    deployment.refresh_from_db()
    assert deployment.state == State.READY, deployment.state_reason
    urls = tuple(deployment.engine_urls)
    seen_by_gateway(lambda s: s.routes["keeper"].urls == urls)
    return deployment


def test_it_pins_a_conversation_to_its_slot_and_restores_it_after_a_stop(
    kept: Callable[..., Deployment], gateway_url: str, api_key: Callable[..., str]
) -> None:
    deployment = kept()
    key = api_key()
    first = chat(gateway_url, key, conversation("Ada"))
    assert first.headers["x-modelship-cache"] == "miss"
    # Another conversation, under another system prompt, takes the other slot: Ada's stays.
    chat(gateway_url, key, conversation("Grace", system=OTHER))
    second = chat(gateway_url, key, conversation("Ada", first))
    assert second.headers["x-modelship-cache"] == "hit"
    assert computed(second) < computed(first) // 2
    fresh = computed(first) + 20  # about what a cold second turn computes

    deployment = restart(deployment)
    folder = kv_store.folder("keeper")
    index = kv_store.read_index(folder)
    assert len(index.entries) == 2  # Ada's slot (her second turn) and Grace's
    for entry in index.entries:
        mode = stat.S_IMODE(os.stat(folder / entry.file).st_mode)
        assert mode == 0o600 and entry.bytes > 0
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    # What `modelship describe` shows of them.
    shown = DeploymentSerializer(deployment).data["saved_conversations"]
    assert shown == {"count": 2, "bytes": sum(e.bytes for e in index.entries)}
    assert saved_text(shown).startswith("2 (")

    restored = restores(gateway_url, "restored")
    again = chat(gateway_url, key, conversation("Ada", first))
    assert again.headers["x-modelship-cache"] == "restored"
    assert said(again) == said(second)  # greedy: the same answer as without the swap
    assert computed(again) < 8 < fresh
    left = kv_store.read_index(folder).entries
    assert len(left) == 1 and all((folder / e.file).is_file() for e in left)  # Ada's let go
    assert restores(gateway_url, "restored") == restored + 1


def test_it_copies_a_shared_system_prompt_into_a_free_slot_rather_than_compute_it(
    kept: Callable[..., Deployment], gateway_url: str, api_key: Callable[..., str], keeping: Any
) -> None:
    keeping.MSHIP_SLOT_COPY_MIN_BLOCKS = 2  # SYSTEM is three blocks
    kept()
    key = api_key()
    # Ada's opening holds a long question: her slot holds more than the system prompt, so a
    # second conversation is not put there (her history would be computed again).
    long_question = "Which of these lines are wrong: " + "the ninth entry, " * 40
    ada = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": long_question}]
    first = chat(gateway_url, key, ada)
    assert first.headers["x-modelship-cache"] == "miss"
    grace = chat(gateway_url, key, conversation("Grace"))
    assert grace.headers["x-modelship-cache"] == "copied"
    assert computed(grace) < computed(first) // 3  # the system prompt came with the copy
    assert copies(gateway_url, "copied") >= 1
    assert not list(kv_store.folder("keeper").glob(f"*{kv_store.COPY_SUFFIX}"))  # let go
    # The copy is the system prompt's own cache: Grace's answer computed with none is the same.
    cold = httpx.post(
        gateway_url + "/v1/chat/completions",
        json={
            "model": "keeper",
            "messages": conversation("Grace"),
            "max_tokens": 8,
            "temperature": 0,
            "cache_prompt": False,
        },
        headers={"authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert computed(cold) > computed(first) // 2, cold.json()["timings"]
    assert said(cold) == said(grace)
    # And Ada's slot still holds her: her next turn computes only what it adds.
    again = chat(gateway_url, key, [*ada, *conversation("Ada", first)[2:]])
    assert again.headers["x-modelship-cache"] == "hit"
    assert computed(again) < computed(first) // 2


def test_it_serves_a_request_whose_copy_the_engine_refuses_as_it_would_have_been(
    kept: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
    keeping: Any,
    tmp_path: Path,
) -> None:
    keeping.MSHIP_SLOT_COPY_MIN_BLOCKS = 2
    engine = kept().engine_urls[0]
    key = api_key()
    long_question = "Which of these lines are wrong: " + "the ninth entry, " * 40
    ada = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": long_question}]
    first = chat(gateway_url, key, ada)
    # The engine cannot write its copy: its folder is gone and a file stands in its way (once
    # the slots' ledger, written there as Ada's request ended, is written).
    folder = kv_store.folder("keeper")
    wait_until(
        lambda: any(s.get("done") and s.get("blocks") for s in kv_store.read_ledger(folder, engine))
    )
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
    folder.write_text("not a folder")
    failed = copies(gateway_url, "failed")
    grace = chat(gateway_url, key, conversation("Grace"))
    assert grace.headers["x-modelship-cache"] == "miss"
    assert computed(grace) > computed(first) // 2  # computed, as with no copy at all
    assert copies(gateway_url, "failed") == failed + 1
    folder.unlink()


def test_it_asks_an_engine_started_with_nowhere_to_save_for_no_copy_again(
    serving: Callable[..., Deployment],
    gateway_url: str,
    api_key: Callable[..., str],
    keeping: Any,
    tiny_model: Path,
) -> None:
    # Started before the site copied (an always-on model keeps nothing): no --slot-save-path.
    keeping.MSHIP_SLOT_COPY_MIN_BLOCKS = 0
    deployment = serving(
        "keeper",
        model=str(tiny_model),
        loader="llama_server",
        memory_gib=0.5,
        config={"n_ctx": 4096, "parallel": 2, "threads": 1},
    )
    argv = Path(deployment.runtime_handle["replicas"][0]["log"]).read_text()
    assert "--slot-save-path" not in argv
    keeping.MSHIP_SLOT_COPY_MIN_BLOCKS = 2
    Deployment.objects.filter(pk=deployment.pk).update(aliases=["keeper-copy"])  # read again
    seen_by_gateway(lambda s: s.routes["keeper"].copies_slots)
    key = api_key()
    long_question = "Which of these lines are wrong: " + "the ninth entry, " * 40
    chat(
        gateway_url,
        key,
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": long_question}],
    )
    failed = copies(gateway_url, "failed")
    grace = chat(gateway_url, key, conversation("Grace"))  # the engine says it cannot (501)
    assert grace.headers["x-modelship-cache"] == "miss"
    assert copies(gateway_url, "failed") == failed + 1
    lin = chat(gateway_url, key, conversation("Lin"))  # not asked again
    assert lin.headers["x-modelship-cache"] in ("hit", "miss")
    assert copies(gateway_url, "failed") == failed + 1


def copies(url: str, outcome: str) -> float:
    sample = f'modelship_slot_copies_total{{deployment="keeper",outcome="{outcome}"}} '
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(sample):
            return float(line.removeprefix(sample))
    return 0.0


def test_it_never_restores_a_cache_for_another_tenant_nor_into_a_changed_model(
    kept: Callable[..., Deployment], gateway_url: str, api_key: Callable[..., str]
) -> None:
    deployment = kept()
    mine, theirs = api_key("mine"), api_key("theirs")
    first = chat(gateway_url, mine, conversation("Ada"))
    deployment = restart(deployment)
    assert len(kv_store.read_index(kv_store.folder("keeper")).entries) == 1
    # The same words from another tenant: its blocks are its own; nothing is restored.
    other = chat(gateway_url, theirs, conversation("Ada", first))
    assert other.headers["x-modelship-cache"] == "miss"
    assert computed(other) > computed(first)
    assert len(kv_store.read_index(kv_store.folder("keeper")).entries) == 1

    # A changed configuration is another model: its caches go as it starts.
    Deployment.objects.filter(pk=deployment.pk).update(config={**deployment.config, "n_ctx": 3072})
    deployment.refresh_from_db()
    restart(deployment)
    assert kv_store.read_index(kv_store.folder("keeper")).entries == []
    assert not list(kv_store.folder("keeper").glob("*.bin"))
    mine_again = chat(gateway_url, mine, conversation("Ada", first))
    assert mine_again.headers["x-modelship-cache"] == "miss"


def test_it_serves_cold_where_a_saved_cache_is_damaged(
    kept: Callable[..., Deployment], gateway_url: str, api_key: Callable[..., str]
) -> None:
    deployment = kept()
    key = api_key()
    first = chat(gateway_url, key, conversation("Ada"))
    deployment = restart(deployment)
    folder = kv_store.folder("keeper")
    (entry,) = kv_store.read_index(folder).entries
    whole = (folder / entry.file).read_bytes()
    (folder / entry.file).write_bytes(whole[: len(whole) // 3])  # truncated
    discarded = restores(gateway_url, "discarded")
    answer = chat(gateway_url, key, conversation("Ada", first))
    assert answer.headers["x-modelship-cache"] == "miss"
    assert computed(answer) > computed(first)
    assert not (folder / entry.file).exists()  # discarded
    assert restores(gateway_url, "discarded") == discarded + 1


def test_it_keeps_the_sites_caches_within_the_disk_budget_oldest_first(
    keeping: Any, tmp_path: Path
) -> None:
    now = time.time()
    for name, ages in (("a", (50, 10)), ("b", (30,))):
        where = kv_store.folder(name)
        with kv_store.locked(where) as index:
            for number, age in enumerate(ages):
                file = f"{name}{number:015d}.bin"
                (where / file).write_bytes(b"k" * 1000)
                index.entries.append(kv_store.Entry(file, [number + 1], 100, 1000, now - age))
    keeping.MSHIP_KV_KEEP_BYTES = 2000
    kv_store.within_budget()
    left = {e.file for n in "ab" for e in kv_store.read_index(kv_store.folder(n)).entries}
    assert left == {"a000000000000001.bin", "b000000000000000.bin"}  # the 50 s old one went
    assert not (kv_store.folder("a") / "a000000000000000.bin").exists()
    # Too old to keep at all, or its file gone: swept; a stray file too.
    keeping.MSHIP_KV_KEEP_MAX_AGE_S = 20
    (kv_store.folder("b") / "stray.bin").write_bytes(b"x")
    with kv_store.locked(kv_store.folder("b")) as index:
        kv_store.sweep(kv_store.folder("b"), index)
    assert kv_store.read_index(kv_store.folder("b")).entries == []
    assert not list(kv_store.folder("b").glob("*.bin"))
    # An index that is not JSON is read as empty (its files then swept as strays).
    (kv_store.folder("a") / kv_store.INDEX).write_text("{not json")
    assert kv_store.read_index(kv_store.folder("a")).entries == []
