"""django-q tasks: thin, idempotent, keyed by primary key. The deployer does the work."""

from __future__ import annotations

import logging

from django.db import transaction

from common import metrics
from deployments import audit, deployer, hooks, kv_store
from deployments.memory import InsufficientMemory
from deployments.models import Deployment, State
from deployments.runtimes import EngineUnreachable

log = logging.getLogger(__name__)


def start(deployment_id: int, actor: str = "system") -> str:
    try:
        deployment = deployer.restart(deployment_id, actor=actor)
    except (InsufficientMemory, EngineUnreachable) as exc:
        return f"refused: {exc}"  # the deployer wrote the event
    except Deployment.DoesNotExist:
        return "gone"
    if actor == "preload" and deployment.state == State.READY:
        metrics.starts.labels(deployment.name, "preload").inc()
    return deployment.state


def stop(deployment_id: int, actor: str = "system", reason: str = "") -> str:
    try:
        stopped = deployer.stop(deployment_id, actor=actor, reason=reason)
    except EngineUnreachable as exc:
        return f"refused: {exc}"
    return "stopped" if stopped else "nothing to stop"


def sleep(deployment_id: int, actor: str = "system") -> bool:
    return deployer.sleep(deployment_id, actor=actor)


def wake(deployment_id: int, actor: str = "system") -> str:
    try:
        return deployer.wake(deployment_id, actor=actor).state
    except InsufficientMemory as exc:
        return f"refused: {exc}"
    except Deployment.DoesNotExist:
        return "gone"  # removed while the task waited in the queue


def replace(deployment_id: int, strategy: str = "blue_green", actor: str = "system") -> str:
    try:
        return str(deployer.replace(deployment_id, strategy, actor=actor).state)
    except (InsufficientMemory, deployer.StartFailed, EngineUnreachable) as exc:
        return f"refused: {exc}"
    except Deployment.DoesNotExist:
        return "gone"  # removed while the task waited in the queue


def remove(deployment_id: int, actor: str = "system") -> bool:
    """Stop the engine, then delete the deployment (not a base whose adapters remain)."""
    if Deployment.objects.filter(adapter_of_id=deployment_id).exists():
        log.warning(
            "deployment %s keeps its engine: it has adapters to remove first", deployment_id
        )
        return False
    deployer.stop(deployment_id, actor=actor, reason="removed")
    with transaction.atomic():
        deployment = Deployment.objects.select_for_update().filter(pk=deployment_id).first()
        if deployment is None:
            return False
        audit.record("delete", deployment, actor=actor, before=deployment.snapshot())
        deployment.delete()
    kv_store.purge(deployment.name)  # its saved conversations go with it
    if deployment.state not in (State.PLANNED, State.STOPPED, State.FAILED):
        # The stop found it busy (going to sleep, or asleep by now): its engines go with it.
        deployer.stop_orphans(deployment)
    hooks.listing_has_changed()  # its entries leave LiteLLM
    return True
