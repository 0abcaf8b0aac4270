"""Every database connection Modelship uses outside Django's request cycle survives the server
dropping it (a restart, a failover, `pg_terminate_backend`): the gateway's pool threads, the
route table's kept connection, the on-demand controller's reads and lease writes, the response
store, the usage ledger and the budget counters. The test drops every backend of its database
at once, then uses each path at once: none may answer 503 or 500, or lose a write."""

from __future__ import annotations

import concurrent.futures
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest
from django.db import connection

from deployments.models import Deployment, State
from openai_api.usage.counters import sync
from openai_api.usage.ledger import ledger
from openai_api.usage.models import UsageMinute
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = [
    pytest.mark.usefixtures("engines"),
    pytest.mark.postgres,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="a server that drops connections"),
]

STATUS_CALLS = 12  # more than the event loop's default pool has threads: each one is used


def drop_every_connection() -> int:
    """What a database restart does to every client but this test's own connection."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


def test_it_serves_every_path_at_once_after_the_database_dropped_its_connections(
    gateway_url: str, api_key: Callable[..., str], make_deployment: Any, site: Any
) -> None:
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    lazy = make_deployment("lazy", mode="on_demand", idle_timeout_s=60, config={"reply": "up"})
    seen_by_gateway(lambda s: "lazy" in s.routes)
    secret = api_key("budgeted", tokens_per_day=1_000_000)
    client = openai.OpenAI(base_url=gateway_url + "/v1", api_key=secret, max_retries=0)
    headers = {"authorization": f"Bearer {secret}"}

    def status() -> int:
        return httpx.get(f"{gateway_url}/v1/models/lazy/status", headers=headers).status_code

    def every_path() -> None:
        chat = client.chat.completions.create(
            model="lazy", messages=[{"role": "user", "content": "hi"}]
        )
        assert chat.choices[0].message.content == "up"
        stored = client.responses.create(model="lazy", input="hi", store=True)
        assert client.responses.retrieve(stored.id).output_text == stored.output_text
        with concurrent.futures.ThreadPoolExecutor(STATUS_CALLS) as pool:
            assert list(pool.map(lambda _: status(), range(STATUS_CALLS))) == [200] * STATUS_CALLS
        assert ledger.flush(), "the usage ledger could not write"
        sync.sync()  # the budget counters read their totals again (or, with Redis, sync)

    every_path()  # each path has used, and where it keeps one kept, a connection
    assert Deployment.objects.get(pk=lazy.pk).state == State.READY
    before = ledger_rows()
    assert drop_every_connection() >= 1  # at least the route table's kept connection

    # A key made now is seen by the route table, whose kept connection was dropped.
    fresh_key = api_key("after")
    assert httpx.get(f"{gateway_url}/v1/models", headers=headers).status_code == 200
    answer = httpx.get(f"{gateway_url}/v1/models", headers={"authorization": f"Bearer {fresh_key}"})
    assert answer.status_code == 200, answer.text
    every_path()
    assert ledger_rows() > before, "usage after the drop was not written"


def ledger_rows() -> int:
    return int(sum(UsageMinute.objects.values_list("requests", flat=True)))
