"""GET /v1/models/{model}/status: where a model stands, for a client whose request waits
without a stream to hear it on (a stream hears the same as comments: wait_status.py).

    {"id": "chat", "object": "model.status", "state": "starting · pulling its container image",
     "start_phase": "pulling its container image", "measured_start_s": 41.2,
     "in_flight": 0, "queued": 3, "waiting": {"waiting_for": "its start", "position": 0,
     "eta_s": 28}}

`in_flight`, `queued` and `waiting` are the site's: the scheduler's owner answers for every
gateway process and host (ondemand/scheduler/). A key sees only the models it may use
(another is 404, as on /v1/models/{model}).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from common.db_calls import off_loop
from deployments import display
from deployments.models import Deployment
from openai_api.dispatch import dispatcher
from openai_api.errors import GatewayError

if TYPE_CHECKING:
    from openai_api.catalog import Route
    from openai_api.exchange import Exchange

SUFFIX = "/status"


def _read(deployment_id: int) -> Deployment | None:
    return Deployment.objects.filter(pk=deployment_id).first()


async def answer(exchange: Exchange, route: Route, name: str) -> None:
    row = await off_loop(_read, route.deployment_id)
    if row is None:
        raise GatewayError(404, f"The model {name!r} does not exist.", "model_not_found")
    counts = await dispatcher.on_demand.status(route) if dispatcher.on_demand else None
    body: dict[str, Any] = {
        "id": name,
        "object": "model.status",
        "state": display.label_of(row, counts),
        "start_phase": row.start_phase,
        "measured_start_s": row.start_s,
        "in_flight": counts["inflight"] if counts else 0,
        "queued": counts["queued"] if counts else 0,
        "waiting": counts.get("waiting") if counts else None,
    }
    await exchange.json(200, json.dumps(body).encode())
