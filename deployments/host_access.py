"""Who may decide what runs on the host.

A deployment's command, image, engine binary and container options (volumes, devices, user,
privileges, network, environment) choose a program and what it can reach: whoever sets them
runs code as Modelship. Changing them takes the `deployments.run_arbitrary_engine`
permission (superusers have every permission), through every door: the admin, /api and
`manage.py deploy --user`. Everything else about a deployment needs only `change`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deployments.refusals import OperationRefused

if TYPE_CHECKING:
    from collections.abc import Mapping

RUN_ARBITRARY_ENGINE = "deployments.run_arbitrary_engine"
# The model fields that choose what runs; a loader's `binary` option counts too.
HOST_FIELDS = ("command", "image", "docker_options")
HOST_CONFIG_KEYS = ("binary",)


class HostAccessDenied(OperationRefused):
    status = 403
    code = "permission_denied"

    def __init__(self, fields: list[str]) -> None:
        message = (
            f"Setting {', '.join(fields)} decides what runs on the host: it needs the"
            f" {RUN_ARBITRARY_ENGINE} permission."
        )
        super().__init__(message, {field: [message] for field in fields})


def host_settings(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """The settings that choose what runs, empty ones as their defaults."""
    values = values or {}
    found: dict[str, Any] = {field: values.get(field) or None for field in HOST_FIELDS}
    config = values.get("config") or {}
    for key in HOST_CONFIG_KEYS:
        found[f"config.{key}"] = config.get(key) if isinstance(config, dict) else None
    return found


def changed_host_fields(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """Which of those settings a change sets (before None: a new deployment)."""
    old, new = host_settings(before), host_settings(after)
    return [name for name, value in new.items() if value != old[name]]


def may_run_anything(user: Any) -> bool:
    return user is None or bool(user.has_perm(RUN_ARBITRARY_ENGINE))


def check(user: Any, before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> None:
    """HostAccessDenied when `user` changes a host setting without the permission. No user
    (a system actor, or the shell's operator) is trusted: they run as Modelship already."""
    if may_run_anything(user):
        return
    fields = changed_host_fields(before, after)
    if fields:
        raise HostAccessDenied(fields)
