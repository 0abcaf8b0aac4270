"""The route table survives a bad row, fails closed when it goes stale, and the fields that
feed it refuse shapes it could not read."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.db import OperationalError, connection
from rest_framework.test import APIClient

from deployments.models import Deployment
from openai_api import catalog as catalog_module
from openai_api.catalog import Catalog, catalog
from openai_api.errors import GatewayError
from openai_api.models import ApiKey
from tests.gateway_support import seen_by_gateway

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("engines")

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_it_leaves_out_a_row_it_cannot_read_and_serves_the_rest(
    gateway_url: str, api_key: Callable[..., str], serving: Any, make_deployment: Any
) -> None:
    serving("good")
    broken = make_deployment("broken")
    key = api_key()
    restricted = api_key("odd")
    with connection.cursor() as cursor:  # what a bad migration or a hand edit can leave
        table = Deployment._meta.db_table
        cursor.execute(f"UPDATE {table} SET runtime_handle = %s WHERE id = %s", ["[1]", broken.pk])
    ApiKey.objects.filter(name="odd").update(allowed_models=5)
    seen_by_gateway(lambda s: "broken" not in s.routes and "good" in s.routes)
    headers = {"authorization": f"Bearer {key}"}
    answer = httpx.post(
        gateway_url + "/v1/chat/completions", json={"model": "good", **CHAT}, headers=headers
    )
    assert answer.status_code == 200
    gone = httpx.post(
        gateway_url + "/v1/chat/completions", json={"model": "broken", **CHAT}, headers=headers
    )
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    # The key whose row cannot be read fails closed.
    odd = httpx.get(gateway_url + "/v1/models", headers={"authorization": f"Bearer {restricted}"})
    assert odd.status_code == 401
    Deployment.objects.filter(pk=broken.pk).update(runtime_handle={})  # for the teardown


def test_it_fails_closed_when_the_route_table_goes_stale(
    gateway_url: str, api_key: Callable[..., str], site: Any
) -> None:
    headers = {"authorization": f"Bearer {api_key()}"}
    assert httpx.get(gateway_url + "/v1/models", headers=headers).status_code == 200
    site.MSHIP_ROUTE_REFRESH_S = 3600  # the reload stops happening, as with a database down
    catalog.request_refresh()
    loaded = catalog.snapshot.loaded_at if catalog.snapshot else 0
    site.MSHIP_ROUTE_STALE_S = 0.5
    while time.monotonic() - loaded < 0.6:
        time.sleep(0.05)
    stale = httpx.get(gateway_url + "/v1/models", headers=headers)
    assert stale.status_code == 503
    assert stale.json()["error"]["code"] == "route_table_stale"
    site.MSHIP_ROUTE_STALE_S = 30
    site.MSHIP_ROUTE_REFRESH_S = 0.05
    catalog.request_refresh()
    seen_by_gateway(lambda s: time.monotonic() - s.loaded_at < 1)
    assert httpx.get(gateway_url + "/v1/models", headers=headers).status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("aliases", 5),
        ("aliases", [{}]),
        ("aliases", {}),
        ("config", []),
        ("docker_options", "x"),
        ("command", "rm -rf /"),
        ("command", []),
    ],
)
def test_it_refuses_a_field_of_the_wrong_json_shape(
    transactional_db: None, field: str, value: Any
) -> None:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("root", "r@example.com", "pw-123456"))
    body = {"name": "sim", "model": "simulated", "loader": "simulated", field: value}
    answer = client.post("/api/deployments/", body, format="json")
    assert answer.status_code == 400 and field in answer.json()
    assert not Deployment.objects.exists()


def test_it_refuses_a_form_encoded_null_for_a_json_field(transactional_db: None) -> None:
    client = APIClient()
    client.force_authenticate(User.objects.create_superuser("root", "r@example.com", "pw-123456"))
    for field in ("aliases", "config"):
        body = {"name": "sim", "model": "simulated", "loader": "simulated", field: "null"}
        answer = client.post("/api/deployments/", body)  # multipart, as a form sends it
        assert answer.status_code == 400, answer.content
        assert field in answer.json()


async def test_it_keeps_the_table_it_started_with_when_the_first_reread_fails(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = Catalog()
    await started.warm()  # the gateway's start: loaded, and read again at the first request
    table = started.snapshot

    def database_down() -> None:
        raise OperationalError("the database went away")

    monkeypatch.setattr(catalog_module, "load", database_down)
    try:
        assert await started.current() is table  # it stands, its age bounding it
        never = Catalog()
        with pytest.raises(GatewayError) as refused:  # with no table at all: fails closed
            await never.current()
        assert refused.value.status == 503 and refused.value.code == "route_table_unavailable"
    finally:
        for task in (started._task,):
            if task is not None:
                task.cancel()
