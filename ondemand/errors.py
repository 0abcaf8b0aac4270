"""The on-demand errors, with the seed's status codes and error codes."""

from __future__ import annotations

from openai_api.errors import GatewayError


def queue_full() -> GatewayError:
    return GatewayError(
        503,
        "Too many requests are waiting for models to start.",
        "ondemand_queue_full",
        {"retry-after": "60"},
    )


def does_not_fit(name: str, need: float, capacity: float) -> GatewayError:
    return GatewayError(
        503,
        f"{name} needs {need:g} GiB, more than the {capacity:g} GiB on-demand models can use.",
        "does_not_fit",
    )


def start_failed(name: str, why: str = "") -> GatewayError:
    return GatewayError(503, f"{name} failed to start{': ' + why if why else ''}.", "start_failed")


def stopped(name: str) -> GatewayError:
    return GatewayError(503, f"{name} was stopped while it started.", "ondemand_stopped")


def not_found(name: str) -> GatewayError:
    return GatewayError(404, f"The model {name!r} does not exist.", "not_found")


def queue_timeout(name: str) -> GatewayError:
    return GatewayError(
        503,
        f"{name} could not be started in time (no memory came free).",
        "ondemand_queue_timeout",
    )
