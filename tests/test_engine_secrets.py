"""Each engine's own secret (deployments/engine_secrets.py): sent to that engine only, in
place of any Authorization a request had, and found by the gateway for an engine that
started after its route table was read. The engines' side (a 401 without it) is in
test_simulated_engine.py and test_llama_engine.py."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx

from deployments.engine_secrets import EngineAuth
from deployments.models import Deployment, State
from openai_api.catalog import Catalog, Snapshot

if TYPE_CHECKING:
    from collections.abc import Callable

ONE, TWO, ELSEWHERE = "http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"


def test_it_sends_each_engine_its_own_secret_and_any_other_address_none() -> None:
    auth = EngineAuth([{"url": ONE, "secret": "one"}, {"url": TWO, "secret": "two"}])
    seen: dict[str, str | None] = {}

    def engine(request: httpx.Request) -> httpx.Response:
        seen[str(request.url)] = request.headers.get("authorization")
        return httpx.Response(200)

    caller = {"authorization": "Bearer the-callers-key"}
    with httpx.Client(transport=httpx.MockTransport(engine), auth=auth, headers=caller) as client:
        for url in (ONE + "/metrics", TWO + "/v1/models", ELSEWHERE + "/v1/models"):
            client.get(url)
    assert seen == {
        ONE + "/metrics": "Bearer one",
        TWO + "/v1/models": "Bearer two",
        ELSEWHERE + "/v1/models": None,
    }


def test_it_reads_the_route_table_again_for_an_engine_it_has_not_seen_and_once_for_a_stranger(
    make_deployment: Callable[..., Deployment],
) -> None:
    table = Catalog()
    table.snapshot = Snapshot()  # read before the engine started (the scheduler saw it first)
    make_deployment(
        "fresh",
        state=State.READY,
        engine_urls=[ONE],
        runtime_handle={"replicas": [{"url": ONE, "secret": "one", "replica": 0}]},
    )
    make_deployment("old", state=State.READY, engine_urls=[TWO])  # started without one
    try:
        assert asyncio.run(table.engine_secret(ONE)) == "one"
        read = table.snapshot
        assert asyncio.run(table.engine_secret(TWO)) == ""
        assert table.snapshot is read  # listed: no second read
        assert asyncio.run(table.engine_secret(ELSEWHERE)) == ""
        stranger = table.snapshot
        assert stranger is not read  # read again, once
        assert asyncio.run(table.engine_secret(ELSEWHERE)) == ""
        assert table.snapshot is stranger
    finally:
        table._db.release()
