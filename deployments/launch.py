"""What a launch needs before and as an engine starts: its container image and its engine
environment (both made before the start-up gate), and each replica's command line,
environment, GPUs and mounts, handed to the runtime.

Blocking (image pulls, installs, process and container launches): deployer.py calls it from
django-q workers, management commands and the on-demand engine threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings

from deployments import engine_envs, engine_secrets, hooks, kv_store
from deployments.adapters import has_adapters, lora_files
from deployments.fingerprint import deployment_fingerprint
from deployments.loaders import EngineSpec, get_loader
from deployments.memory import gpu_inventory
from deployments.models import STARTABLE_STATES, Deployment
from deployments.runtimes import EngineUnreachable, Handle, Launch, RuntimeError_, get_runtime
from deployments.store.refs import NotInStore, resolve
from deployments.transitions import refused_to, transition

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger(__name__)


Needs = tuple[str | None, str | None]


def needs_of(deployment: Deployment) -> Needs:
    """What a start prepares for: the engine family and, in a container, the image."""
    image = None
    if deployment.runtime == "docker":
        image = deployment.image or get_loader(deployment.loader).image(EngineSpec.of(deployment))
    return family_of(deployment), image


def prepare(deployment_id: int, *, actor: str = "system") -> Needs | None:
    """A start's image pull and engine environment install, outside the start-up gate: what
    was prepared when the start may go on, None when either failed (the deployment failed,
    with why)."""
    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is None or deployment.state not in STARTABLE_STATES:
        return (None, None)  # gone, or started meanwhile: its start finds out
    try:
        prepare_start(deployment)
    except EngineUnreachable as exc:
        # Nothing started: it stays as it was, with the reason, and a mode switch waiting
        # for this start is dropped (its requests stop waiting for it).
        prior = deployment.state
        transition(
            deployment, prior, expected=[prior], reason=str(exc), actor=actor, drop_switch=True
        )
        raise
    except (RuntimeError_, engine_envs.EnvFailed) as exc:
        # No image or no environment: failed, or as it was where a mode switch started it;
        # the switch is dropped, not applied.
        transition(
            deployment,
            refused_to(deployment.pk, deployment.state),
            expected=STARTABLE_STATES,
            reason=str(exc),
            actor=actor,
            drop_switch=True,
        )
        return None
    return needs_of(deployment)


def prepare_start(deployment: Deployment) -> None:
    """What a start needs before it takes the start-up gate: its image and its engine
    environment. A pull of gigabytes or an install that compiles an engine takes minutes,
    and under the gate would hold up every other deployment's start; the start's fit check
    and its memory come after, under the gate. Each one's progress is the state reason, and
    the hooks tell the requests waiting for the start."""
    try:
        fetch_image(deployment)
        prepare_engine_env(deployment)
    finally:
        Deployment.objects.filter(pk=deployment.pk).update(start_phase="")
        hooks.start_is_preparing(deployment.pk, "")


def told(deployment: Deployment, doing: str) -> Callable[[str], None]:
    """A progress line's reader: the state reason of a deployment that has not started yet
    (a running one's replacement leaves it alone), and the hooks hear what it is doing."""

    def progress(line: str) -> None:
        Deployment.objects.filter(pk=deployment.pk, state__in=STARTABLE_STATES).update(
            state_reason=line, start_phase=doing
        )
        hooks.start_is_preparing(deployment.pk, doing)

    return progress


def fetch_image(deployment: Deployment) -> None:
    """A container's image, pulled unless the container engine has it."""
    image = needs_of(deployment)[1]
    if image is None:
        return
    get_runtime(deployment.runtime).prepare(image, told(deployment, "pulling its container image"))


def prepare_engine_env(deployment: Deployment) -> None:
    """An engine's family environment, installed before its first start (blocking: minutes
    for a large family). A container runs it too, mounted from the host (launch_all)."""
    family = family_of(deployment)
    if family is None:
        return
    engine_envs.ensure(family, told(deployment, f"installing its engine environment ({family})"))


def family_of(deployment: Deployment) -> str | None:
    """The engine environment a deployment runs on (None: Modelship's Python, or its own
    command)."""
    if deployment.command:
        return None
    container = deployment.runtime == "docker"
    return get_loader(deployment.loader).engine_family(EngineSpec.of(deployment), container)


def deployment_families() -> set[str]:
    """The families every deployment of this site runs on (engine_env prune keeps them)."""
    found = set()
    for deployment in Deployment.objects.all():
        with contextlib.suppress(engine_envs.EnvFailed, KeyError, ValueError):
            family = family_of(deployment)
            if family:
                found.add(family)
    return found


def launch_all(
    deployment: Deployment,
    placed: list[list[int]] | None = None,
    indices: list[int] | None = None,
) -> list[Handle]:
    """Launch every replica (or those numbered ``indices``: a scale up) on its GPUs
    (``placed``, one list per replica launched, else the row's); on a failure, stop the ones
    already launched."""
    loader = get_loader(deployment.loader)
    try:
        resolve(deployment.model)
    except NotInStore as exc:
        raise RuntimeError_(str(exc)) from exc
    spec = EngineSpec.of(deployment)
    gpus = {g.index: g.total_gib for g in gpu_inventory()}
    placed = deployment.gpus if placed is None else placed
    runtime = get_runtime(deployment.runtime)
    fp = deployment_fingerprint(deployment)
    container = deployment.runtime == "docker"
    if not container:
        # A process engine runs in a folder of its own: a model path relative to Modelship's
        # working directory is made absolute.
        spec = dataclasses.replace(spec, model=local_path(spec.model))
    loras = lora_files(deployment)
    enabled = has_adapters(deployment)
    spec = dataclasses.replace(spec, adapters=tuple(p for _, p in loras), lora=enabled)
    # Its slots' caches saved at a stop and restored after, or copied between its slots.
    if kv_store.keeps(deployment) or kv_store.copies(deployment, loader.pinned_slots(spec)):
        try:
            saved_in = str(kv_store.prepare(deployment, spec.adapters))
            spec = dataclasses.replace(spec, slot_save_path=saved_in)
        except OSError as exc:  # it starts keeping nothing, rather than not at all
            log.warning("%s: slot caches not kept: %s", deployment.name, exc)
    family = loader.engine_family(spec, container)
    # A container runs its family's environment from the host, mounted where it lies, and
    # sees its adapters' files where they lie.
    mounts = [str(engine_envs.location(family))] if container and family else []
    if container:
        mounts += sorted({os.path.dirname(path) for _, path in loras})
    handles: list[Handle] = []
    try:
        numbers = list(range(deployment.replica_count)) if indices is None else indices
        for position, replica in enumerate(numbers):
            # On a GPU host each replica sees its own devices only (none: no GPU at all).
            devices = (placed[position] if position < len(placed) else []) if gpus else None
            if devices:
                spec = dataclasses.replace(spec, device_gib=gpus[devices[0]])
            # The runtime fills in the address it chose; an operator's command may use both.
            argv = deployment.command or loader.argv(spec, "{host}", "{port}", container)
            # Each replica's own secret, in its environment (engine_secrets.py).
            secret = engine_secrets.new() if loader.secret_env else ""
            given = {loader.secret_env: secret} if secret else {}
            handles.append(
                runtime.launch(
                    Launch(
                        deployment_id=deployment.pk,
                        name=deployment.name,
                        replica=replica,
                        argv=list(argv),
                        health_path=loader.health_path,
                        fingerprint=fp,
                        env={**cache_env(), **loader.env(spec), **given},
                        image=deployment.image or loader.image(spec),
                        options={**loader.docker_defaults(spec), **deployment.docker_options},
                        model=spec.model,
                        num_gpus=spec.num_gpus,
                        memory_gib=float(deployment.memory_gib or 0),
                        resources=dict(deployment.ray_resources or {}),
                        gpus=devices,
                        mounts=[] if deployment.command else mounts,
                        cache=str(settings.MSHIP_HF_HOME),
                    )
                )
            )
            handles[-1]["adapters"] = [name for name, _ in loras]  # in their --lora order
            handles[-1]["lora"] = enabled
            if secret:
                handles[-1][engine_secrets.HANDLE_KEY] = secret
    except RuntimeError_:
        stop_handles(deployment, handles)
        raise
    return handles


def cache_env() -> dict[str, str]:
    """The shared model cache, and the Hub token where Modelship was given one."""
    cache = Path(settings.MSHIP_HF_HOME)
    # Made here: a container's mount of a missing folder would make it root's.
    with contextlib.suppress(OSError):
        cache.mkdir(parents=True, exist_ok=True)
    env = {"HF_HOME": str(cache)}
    if os.environ.get("HF_TOKEN"):
        env["HF_TOKEN"] = os.environ["HF_TOKEN"]
    return env


def local_path(model: str) -> str:
    """A relative model path made absolute, read from the site's folder first (where
    host_access checked it), then from here; anything else (a hub id) as it is."""
    if os.path.isabs(model):
        return model
    for base in (str(settings.BASE_DIR), os.getcwd()):
        if os.path.exists(candidate := os.path.join(base, model)):
            return os.path.abspath(candidate)
    return model


def stop_handles(deployment: Deployment, handles: list[Handle]) -> None:
    runtime = get_runtime(deployment.runtime)
    for handle in handles:
        runtime.stop(handle, settings.MSHIP_STOP_GRACE_S)
