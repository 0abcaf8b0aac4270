"""LiteLLMSync: every deployment registered with a site's LiteLLM proxy, as the on-demand
seed's "LiteLLM registration" says.

Always-on deployments point at their engine (one entry per served name and replica);
on-demand ones at Modelship's on-demand gateway with the on-demand key, long timeouts, no
retries and the health-check marker, in every state but failed. An entry's id is derived
from everything it says (the engine address; for on-demand entries the key and parameter
fingerprints), so an unchanged deployment writes nothing, and a changed one gets its new
entry added before the old one is deleted, so its name is never missing. The id carries
only a prefix of each fingerprint: an entry listed under a wanted id is also compared by
its full fingerprints (model_info), and one that differs is replaced under the same id. A
sync that cannot read LiteLLM's list deletes nothing.

Blocking (httpx, the ORM): it runs in the django-q cluster (a schedule and on changes) and
from `manage.py sync_litellm`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from django.conf import settings

from deployments import engine_secrets
from deployments.loaders import LOADERS, EngineSpec
from deployments.models import Deployment, State
from ondemand.models import LiteLLMStatus

log = logging.getLogger(__name__)
ID_PREFIX = "modelship-"
HEALTH_CHECK = {"extra_headers": {"x-modelship-health-check": "1"}}
MODES = {
    "generate": "chat",
    "embed": "embedding",
    "transcription": "audio_transcription",
    "translation": "audio_transcription",
    "tts": "audio_speech",
    "image": "image_generation",
}


@dataclass(frozen=True)
class Site:
    url: str
    master_key: str
    internal_url: str


def site() -> Site | None:
    """The LiteLLM proxy to register with; None when none is configured."""
    url = settings.MSHIP_LITELLM_URL.rstrip("/")
    if not url:
        return None
    try:
        master_key = Path(settings.MSHIP_LITELLM_MASTER_KEY_FILE).read_text().strip()
    except OSError:
        master_key = ""
    return Site(url, master_key, settings.MSHIP_INTERNAL_URL.rstrip("/"))


def ondemand_key() -> str | None:
    try:
        key = Path(settings.MSHIP_ONDEMAND_KEY_FILE).read_text().strip()
    except OSError:
        return None
    return key or None


def fingerprint(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def ondemand_timeout_s() -> float:
    return max(1200.0, settings.MSHIP_ONDEMAND_QUEUE_TIMEOUT_S + 600)


@dataclass
class Plan:
    """What LiteLLM should list: entries by id, and per deployment a status word."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    status: dict[int, str] = field(default_factory=dict)
    keep: set[int] = field(default_factory=set)  # deployments whose entries must stay as they are


def plan(internal_url: str, key: str | None) -> Plan:
    wanted = Plan()
    for deployment in Deployment.objects.select_related("adapter_of").order_by("pk"):
        loader = LOADERS.get(deployment.loader)
        if loader is None:
            continue
        spec = EngineSpec.of(deployment)
        info = {
            "modelship_id": deployment.pk,
            "mode": MODES.get(deployment.usecase, "chat"),
            "supported_endpoints": [f"/v1/{e}" for e in loader.endpoints(spec)],
        }
        served = [deployment.name, *(deployment.aliases or [])]
        # An adapter's engine is its base's, and its request takes the gateway's rewrite:
        # always through /ondemand/{base}, which forwards to a base that is always on too.
        engine = deployment.adapter_of or deployment
        # A base with adapters too: its engine would take a `lora` the gateway drops.
        through_gateway = deployment.adapter_of is not None or deployment.adapters.exists()
        if engine.is_on_demand or through_gateway:
            if engine.state == State.FAILED:
                wanted.status[deployment.pk] = "not_registered_failed"
                continue
            if key is None:
                wanted.status[deployment.pk] = "ondemand_not_configured"
                wanted.keep.add(deployment.pk)
                continue
            timeout = ondemand_timeout_s()
            params = {
                "api_base": f"{internal_url}/ondemand/{engine.pk}/v1",
                "timeout": timeout,
                "stream_timeout": timeout,
                "num_retries": 0,
            }
            extra_info = {"health_check_params": HEALTH_CHECK}
            key_fp = hashlib.sha256(key.encode()).hexdigest()[:12]
            params_fp = fingerprint([params, extra_info])
            for name in served:
                entry_id = f"{ID_PREFIX}{deployment.pk}-{name}-od-{key_fp[:6]}{params_fp[:6]}"
                wanted.entries[entry_id] = {
                    "model_name": name,
                    "litellm_params": {"model": f"openai/{name}", "api_key": key, **params},
                    "model_info": {
                        "id": entry_id,
                        **info,
                        **extra_info,
                        "modelship_key_fp": key_fp,
                        "modelship_params_fp": params_fp,
                    },
                }
            wanted.status[deployment.pk] = "registered"
        elif deployment.state == State.READY and deployment.engine_urls:
            # Straight to each engine, with its own secret (deployments/engine_secrets.py):
            # a restart's new one is a new entry, as a new address is.
            secrets = engine_secrets.by_url((deployment.runtime_handle or {}).get("replicas", []))
            for url in deployment.engine_urls:
                secret = secrets.get(url, "")
                where = fingerprint([url, secret] if secret else url)[:8]
                for name in served:
                    entry_id = f"{ID_PREFIX}{deployment.pk}-{name}-{where}"
                    wanted.entries[entry_id] = {
                        "model_name": name,
                        "litellm_params": {
                            "model": f"openai/{name}",
                            "api_base": f"{url}/v1",
                            "api_key": secret or "none",
                        },
                        "model_info": {"id": entry_id, **info},
                    }
            wanted.status[deployment.pk] = "registered"
        else:
            wanted.status[deployment.pk] = "not_registered_not_ready"
    return wanted


class LiteLLMError(Exception):
    pass


class Client:
    def __init__(self, target: Site, timeout: float = 10.0) -> None:
        self.http = httpx.Client(
            base_url=target.url,
            headers={"authorization": f"Bearer {target.master_key}"},
            timeout=timeout,
        )

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            answer = self.http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise LiteLLMError(f"LiteLLM cannot be reached: {exc}") from exc
        if answer.status_code >= 400:
            raise LiteLLMError(
                f"LiteLLM answered {answer.status_code} to {path}: {answer.text[:300]}"
            )
        return answer.json() if answer.content else None

    def ours(self) -> dict[str, dict[str, Any]]:
        """Modelship's entries in LiteLLM's list, by id."""
        data = (self._call("GET", "/model/info") or {}).get("data") or []
        return {
            str(e["model_info"]["id"]): e
            for e in data
            if (e.get("model_info") or {}).get("modelship_id") is not None
        }

    def add(self, entry: dict[str, Any]) -> None:
        self._call("POST", "/model/new", entry)

    def delete(self, entry_id: str) -> None:
        self._call("POST", "/model/delete", {"id": entry_id})

    def close(self) -> None:
        self.http.close()


@dataclass
class Outcome:
    added: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    error: str = ""


# The fingerprints an on-demand entry's id carries only a prefix of, in full in its
# model_info (LiteLLM's /model/info shows them; always-on entries carry none).
FINGERPRINTS = ("modelship_key_fp", "modelship_params_fp")


def same(present: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether a listed entry has the full fingerprints of the wanted one under its id."""
    listed, meant = present.get("model_info") or {}, wanted.get("model_info") or {}
    return all(listed.get(key) == meant.get(key) for key in FINGERPRINTS)


def sync() -> Outcome | None:
    """One sync; None when no LiteLLM is configured. Its outcome is kept for the API."""
    target = site()
    if target is None:
        return None
    outcome = Outcome()
    wanted = plan(target.internal_url, ondemand_key())
    client = Client(target)
    try:
        present = client.ours()
        stale = [i for i, e in wanted.entries.items() if i in present and not same(present[i], e)]
        for entry_id, entry in wanted.entries.items():
            if entry_id not in present:
                client.add(entry)
                outcome.added.append(entry_id)
        for entry_id in stale:
            # Its id's fingerprint prefixes collided with the new ones: the id cannot be
            # listed twice, so this rare replacement deletes before it adds.
            client.delete(entry_id)
            outcome.deleted.append(entry_id)
            client.add(wanted.entries[entry_id])
            outcome.added.append(entry_id)
        for entry_id, entry in present.items():
            owner = entry["model_info"]["modelship_id"]
            if entry_id not in wanted.entries and owner not in wanted.keep:
                client.delete(entry_id)
                outcome.deleted.append(entry_id)
    except LiteLLMError as exc:
        # Deletes come last and stop at the first failure: nothing unverified is removed.
        outcome.error = str(exc)
    finally:
        client.close()
    LiteLLMStatus.record(outcome, wanted.status)
    return outcome


def config_yaml() -> str:
    """The entries a sync would register, as a static `model_list` (for a LiteLLM proxy
    without a database)."""
    target = site()
    internal = target.internal_url if target else settings.MSHIP_INTERNAL_URL.rstrip("/")
    wanted = plan(internal, ondemand_key())
    return yaml.safe_dump({"model_list": list(wanted.entries.values())}, sort_keys=False)


def status_now() -> dict[str, Any]:
    """For GET /api/host."""
    row = LiteLLMStatus.objects.filter(pk=1).first()
    configured = site() is not None
    return {
        "litellm_configured": configured,
        "litellm_ready": bool(configured and row and row.ok),
        "litellm_error": row.error if row else "",
        "litellm_synced_at": row.synced_at if row else None,
    }


def deployment_statuses() -> dict[str, str] | None:
    """Each deployment's status word by id (one read for a whole list); None when no LiteLLM
    is configured. After a failed sync every deployment reads `error`."""
    if not settings.MSHIP_LITELLM_URL:
        return None
    row = LiteLLMStatus.objects.filter(pk=1).first()
    if row is None:
        return {}
    if not row.ok:
        return {"*": "error"}
    return {str(k): str(v) for k, v in row.deployments.items()}


def deployment_status(deployment_id: int, statuses: dict[str, str] | None = None) -> str | None:
    statuses = deployment_statuses() if statuses is None else statuses
    if statuses is None:
        return None
    return statuses.get(str(deployment_id), statuses.get("*", "unknown"))


__all__ = ["Outcome", "config_yaml", "status_now", "sync"]
