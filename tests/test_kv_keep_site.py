"""The slots and their kept caches on a real host's default, `serve --workers 4`: the
scheduler's owner pins every worker's requests (new connections, spread over the workers by
the kernel) to one table of slots, writes the ledger the stop reads, and restores a saved
cache whichever worker the next turn reaches."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest

from deployments import deployer, kv_store
from deployments.models import State
from tests.site_support import Site, known, shown, started
from tests.test_kv_keep import OTHER, conversation, said, tiny_model  # noqa: F401 - a fixture

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from deployments.models import Deployment

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.heavy]


def chat(url: str, key: str, messages: list[dict[str, str]]) -> httpx.Response:
    with httpx.Client(timeout=120) as client:  # a new connection: any worker
        answer = client.post(
            url + "/v1/chat/completions",
            json={"model": "keeper", "messages": messages, "max_tokens": 8, "temperature": 0},
            headers={"authorization": f"Bearer {key}"},
        )
    assert answer.status_code == 200, answer.text
    return answer


def test_it_pins_and_restores_through_the_sites_one_table(
    four_workers: Site,
    site: Any,
    tiny_model: Path,  # noqa: F811 - the fixture
    api_key: Callable[..., str],
    make_deployment: Callable[..., Deployment],
) -> None:
    site.VAR_DIR = four_workers.var  # the engine saves where the site's owner writes
    site.MSHIP_KV_KEEP_MIN_TOKENS = 32
    url = four_workers.url
    config = {"n_ctx": 4096, "parallel": 2, "threads": 1}
    fields: dict[str, Any] = {"loader": "llama_server", "mode": "on_demand", "memory_gib": 0.5}
    keeper = started(make_deployment, "keeper", model=str(tiny_model), config=config, **fields)
    key = known(url, api_key())
    shown(url, key, "keeper", "ready")
    first = chat(url, key, conversation("Ada"))
    assert first.headers["x-modelship-cache"] == "miss"
    chat(url, key, conversation("Grace", system=OTHER))
    # Every turn from a new connection: the workers differ, the slot table is the owner's.
    for _ in range(3):
        assert chat(url, key, conversation("Ada", first)).headers["x-modelship-cache"] == "hit"
    answer = said(chat(url, key, conversation("Ada", first)))

    assert deployer.stop(keeper.pk, reason="a test's swap")
    assert len(kv_store.read_index(kv_store.folder("keeper")).entries) == 2
    deployer.restart(keeper.pk)
    keeper.refresh_from_db()
    assert keeper.state == State.READY
    shown(url, key, "keeper", "ready")
    again = chat(url, key, conversation("Ada", first))
    assert again.headers["x-modelship-cache"] == "restored"
    assert said(again) == answer
    assert again.json()["usage"]["prompt_tokens"] > 0
