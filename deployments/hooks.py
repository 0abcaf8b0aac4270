"""What the layers above the control plane do when it changes something.

deployments imports no upper layer (DESIGN.md, "Architecture rules"): where a change here
must cause something there (LiteLLM's list, the live admin), this module
calls the functions the upper layer registered at start-up. Plain lists of functions, called
in order; no Django signals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

# What LiteLLM should list may have changed: a state entered or left, a mode switched, a
# deployment removed. The on-demand app registers its LiteLLM sync request.
listing_changed: list[Callable[[], None]] = []
# A deployment's state changed (its id is passed): the live admin is told.
state_changed: list[Callable[[int], None]] = []
# What a start does before it takes the start-up gate (its id and the words: "installing
# its engine environment (family)", "pulling its container image"; "" once that is over):
# the on-demand gateway tells the requests waiting for the start. Called from the thread
# that does it.
start_preparing: list[Callable[[int, str], None]] = []


def _nothing(*_: Any) -> None:
    return None


@dataclass
class Reports:
    """What the upper layers tell about deployments, shown by the admin and /api: each
    reads None until the on-demand app registers its reader."""

    # A deployment's on-demand counts and phase (None for an always-on one).
    ondemand_status: Callable[[Any], dict[str, Any] | None] = _nothing
    # Every deployment's LiteLLM registration word by id, read once for a list.
    litellm_statuses: Callable[[], dict[str, str] | None] = _nothing
    # One deployment's word out of those.
    litellm_status: Callable[[int, dict[str, str] | None], str | None] = _nothing
    # The site's LiteLLM sync status, for /api/host.
    litellm_site_status: Callable[[], dict[str, Any] | None] = _nothing


reports = Reports()


def listing_has_changed() -> None:
    for hook in list(listing_changed):
        hook()


def state_has_changed(deployment_id: int) -> None:
    for hook in list(state_changed):
        hook(deployment_id)


def start_is_preparing(deployment_id: int, doing: str) -> None:
    for hook in list(start_preparing):
        hook(deployment_id, doing)


def register(hooks: list[Callable[..., None]], hook: Callable[..., None]) -> None:
    """Add a hook once, however often the registering code runs."""
    if hook not in hooks:
        hooks.append(hook)
