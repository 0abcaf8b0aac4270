"""What every engine server Modelship ships has in common: its command line, errors, models.

The loaders in deployments/loaders/shipped.py build the same command line for each.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from deployments.engines import engine_errors

if TYPE_CHECKING:
    from collections.abc import Callable


def parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--served-model-name", nargs="+", default=None)
    parser.add_argument("--config", default=None, help="JSON object of the engine's options")
    return parser


def config_of(raw: str | None) -> dict[str, Any]:
    data = json.loads(raw) if raw else {}
    if not isinstance(data, dict):
        raise SystemExit("--config must be a JSON object")
    return data


def error(
    status: int, message: str, code: str, type_: str = "invalid_request_error"
) -> web.Response:
    """An OpenAI-shaped error."""
    body = {"error": {"message": message, "type": type_, "code": code}}
    return web.json_response(body, status=status)


def models_handler(served_names: list[str], owner: str) -> Any:
    created = int(time.time())

    def card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": owner}

    async def models(request: web.Request) -> web.Response:
        wanted = request.match_info.get("model")
        if wanted is None:
            return web.json_response({"object": "list", "data": [card(n) for n in served_names]})
        if wanted not in served_names:
            return error(404, f"The model {wanted!r} does not exist.", "model_not_found")
        return web.json_response(card(wanted))

    return models


async def health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def json_body(request: web.Request) -> dict[str, Any] | web.Response:
    try:
        body = await request.json()
    except (ValueError, LookupError):  # LookupError: a charset Python has no codec for
        return error(400, "The body must be a JSON object.", "invalid_json")
    if not isinstance(body, dict):
        return error(400, "The body must be a JSON object.", "invalid_json")
    return body


# The engine's own secret, given by Modelship in its environment (deployments/
# engine_secrets.py): a request under /v1 must carry it, as vLLM's --api-key asks.
SECRET_ENV = "MSHIP_ENGINE_SECRET"


def secret_guard(secret: str) -> Any:
    """A middleware that answers 401 to a request under /v1 without `Authorization: Bearer`
    and the secret (compared in constant time); /health, /metrics and the rest stay open,
    as vLLM leaves them."""
    expected = f"Bearer {secret}".encode()

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/v1"):
            given = request.headers.get("Authorization", "").encode("utf-8", "replace")
            if not hmac.compare_digest(given, expected):
                return error(401, "Unauthorized", "invalid_api_key", "authentication_error")
        response: web.StreamResponse = await handler(request)
        return response

    return guard


def engine_app(
    served_names: list[str], routes: list[web.RouteDef], owner: str = "modelship", **options: Any
) -> web.Application:
    """An engine's app: its own routes plus /v1/models (and one model's card) and /health;
    with MSHIP_ENGINE_SECRET set, /v1 asks for it."""
    secret = os.environ.get(SECRET_ENV, "")
    middlewares = [secret_guard(secret)] if secret else []
    app = web.Application(middlewares=middlewares, **options)
    engine_errors.install(app)  # every answer JSON, a body it cannot read a 400
    app.add_routes(
        [
            *routes,
            web.get("/v1/models", models_handler(served_names, owner)),
            web.get("/v1/models/{model:.+}", models_handler(served_names, owner)),
            web.get("/health", health),
            web.get("/", health),  # where engines such as sd-server answer theirs
        ]
    )
    return app


def run_engine(
    prog: str, build: Callable[[str, dict[str, Any], list[str]], web.Application]
) -> None:
    """The main of a shipped engine: its command line, then build(model, config, names)."""
    args = parser(prog).parse_args()
    config = config_of(args.config)
    names = args.served_model_name or [args.model]
    serve(build(args.model, config, names), args.host, args.port)


def serve(app: web.Application, host: str, port: int, *, handle_signals: bool = True) -> None:
    web.run_app(
        app,
        host=host,
        port=port,
        print=None,
        access_log=None,
        handler_cancellation=True,
        handle_signals=handle_signals,
        # As vLLM's uvicorn: a burst of first connections queues for accept() instead of
        # overflowing aiohttp's 128 and waiting out the kernel's one-second SYN retry.
        backlog=2048,
    )
