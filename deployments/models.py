"""Deployments, their audit trail and their events."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from common.json_shapes import command_line, json_object, list_of_names
from common.priority import PriorityField
from common.versioned import Versioned, VersionedQuerySet
from deployments import loaders
from deployments.auth_models import ApiToken, LoginFailure  # noqa: F401  (registered here)
from deployments.autoscaling import AutoscalingConfig
from deployments.fingerprint import CONFIG_FIELDS
from deployments.store.models import StoredModel  # noqa: F401  (registered here)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$"
NAME_RULE = "Use letters, digits and . _ : / @ + - (start with a letter or digit, at most 200)."
name_validator = RegexValidator(NAME_PATTERN, NAME_RULE)


class Usecase(models.TextChoices):
    GENERATE = "generate"
    EMBED = "embed"
    TRANSCRIPTION = "transcription"
    TRANSLATION = "translation"
    TTS = "tts"
    IMAGE = "image"


class Runtime(models.TextChoices):
    PROCESS = "process"
    DOCKER = "docker"
    RAY = "ray"


class Mode(models.TextChoices):
    ON_DEMAND = "on_demand"
    ALWAYS_ON = "always_on"


class ResponsesBy(models.TextChoices):
    """Who answers a deployment's /v1/responses."""

    GATEWAY = "gateway", "Modelship, over the engine's chat completions"
    ENGINE = "engine", "the engine's own /v1/responses (Modelship keeps the stored state)"


class State(models.TextChoices):
    PLANNED = "planned"
    STARTING = "starting"
    READY = "ready"
    ASLEEP = "asleep"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


# States in which an engine exists and holds accelerator memory. A sleeping vLLM engine has
# released its weights and KV cache, so it does not count against the budget.
HOLDING_STATES = (State.STARTING, State.READY, State.STOPPING)
# States from which a start may begin.
STARTABLE_STATES = (State.PLANNED, State.STOPPED, State.FAILED)


def effective_mode_of(mode: str | None, system: bool, autoscaling_config: Any) -> str:
    """The mode a deployment runs in, the one rule every on-demand decision reads: a system
    deployment is always on; an unset mode is on demand where it scales to zero (the seed's
    min_replicas: 0), else always on."""
    if system:
        return Mode.ALWAYS_ON
    if not mode:
        scaling = AutoscalingConfig.of(autoscaling_config)
        return Mode.ON_DEMAND if scaling and scaling.min_replicas == 0 else Mode.ALWAYS_ON
    return mode


class Deployment(Versioned):
    # Written often, read by no route: the on-demand lease, a start's progress line.
    UNVERSIONED = frozenset({"lease_until", "state_reason"})
    objects = VersionedQuerySet["Deployment"].as_manager()

    name = models.CharField(
        max_length=200, unique=True, validators=[name_validator], help_text="Served model name."
    )
    aliases = models.JSONField(default=list, blank=True, validators=[list_of_names])
    loader = models.CharField(max_length=32, choices=loaders.choices)
    usecase = models.CharField(max_length=32, choices=Usecase.choices, default=Usecase.GENERATE)
    model = models.CharField(max_length=500, help_text="Path or id, as the engine takes it.")
    runtime = models.CharField(max_length=16, choices=Runtime.choices, default=Runtime.PROCESS)
    image = models.CharField(max_length=500, blank=True, default="")
    command = models.JSONField(
        null=True,
        blank=True,
        validators=[command_line],
        help_text="Replaces the loader's command line when set.",
    )
    config = models.JSONField(
        default=dict, blank=True, validators=[json_object], help_text="The loader's own options."
    )
    docker_options = models.JSONField(
        default=dict,
        blank=True,
        validators=[json_object],
        help_text="Container settings for the docker runtime: gpus, ipc_mode, shm_size, "
        "environment, volumes, mem_limit, cpus, working_dir, user.",
    )
    ray_resources = models.JSONField(
        default=dict,
        blank=True,
        validators=[json_object],
        help_text="Ray's custom resources each replica asks for (the ray runtime), such as"
        ' {"a100": 1}: Ray places it on a node that declares them.',
    )
    # A LoRA adapter: served by its own name from its base's engines (deployments/adapters.py),
    # with no engine of its own.
    adapter_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="adapters",
        help_text="A LoRA adapter of this deployment (its model is the adapter's file),"
        " served by its own name from the base's engines.",
    )
    # Bounded so that sums over replicas and deployments stay finite numbers.
    memory_gib = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(2**20)]
    )
    num_gpus = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0), MaxValueValidator(1024)]
    )
    num_replicas = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(64)]
    )
    autoscaling_config = models.JSONField(
        null=True,
        blank=True,
        help_text="Replicas that follow load, as Ray Serve's: min_replicas, max_replicas,"
        " initial_replicas, target_ongoing_requests, upscale_delay_s, downscale_delay_s."
        " min_replicas 0 is on demand.",
    )
    # None: not set, the site's default (always on); the API and models.yaml send null.
    mode = models.CharField(  # noqa: DJ001
        max_length=16, choices=Mode.choices, null=True, blank=True
    )
    idle_timeout_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(60), MaxValueValidator(86400)],
        help_text="Seconds idle before an on-demand deployment stops; empty: the site default.",
    )
    evictable = models.BooleanField(
        "may be stopped to make room",
        default=True,
        help_text="On demand: whether an idle engine of it may be stopped (or put to sleep)"
        " to make room for another deployment's start. Off pins it once loaded: only its own"
        " idle timeout, an operator or a shutdown stops it.",
    )
    preload = models.BooleanField(
        "start when Modelship starts",
        default=False,
        help_text="On demand: the baseline. Started by `serve` as it starts, as if a request"
        " had come, and again once the host has been idle MSHIP_BASELINE_AFTER_S; its idle"
        " timeout does not put it away meanwhile (make-room does, when another needs the"
        " memory).",
    )
    priority = PriorityField(
        help_text="high, normal, low or a number from -100 to 100. On demand: added to the"
        " caller's key's class, it orders its requests in the queue; a request of a lower class"
        " never stops it to make room.",
    )
    max_concurrency = models.PositiveIntegerField(
        "most requests at once",
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="On the whole site: more wait (the higher class first; within a class the"
        " keys take turns) or get 429, as MSHIP_CONCURRENCY_OVERFLOW says; empty: no limit.",
    )
    # None: no mode switch is waiting for a start (the API shows null).
    pending_mode = models.CharField(  # noqa: DJ001
        "mode switch waiting", max_length=16, choices=Mode.choices, null=True, blank=True
    )
    system = models.BooleanField(
        default=False, help_text="Always on and never on demand (a decision model)."
    )
    responses = models.CharField(
        max_length=16,
        choices=ResponsesBy.choices,
        default=ResponsesBy.GATEWAY,
        help_text="Who answers /v1/responses: Modelship's translation onto chat completions,"
        " or the engine's own (vLLM) with stored responses, previous_response_id and"
        " conversations still kept by Modelship.",
    )

    state = models.CharField(max_length=16, choices=State.choices, default=State.PLANNED)
    state_reason = models.TextField(blank=True, default="")
    # What a start that has not launched yet is doing (pulling its image, installing its
    # engine environment): its progress is the state reason meanwhile. Empty otherwise.
    # Per replica: what a start that ran out of memory showed it needs (deployments/
    # out_of_memory.py); the fit check claims the larger of it and the estimate.
    learned_gib = models.FloatField("memory learned (GiB)", null=True, blank=True, editable=False)
    # The GPU model it was learned on ("" on a host without one): another model's memory is
    # another figure. After each start that became ready, what its engine was measured to
    # hold per replica (deployments/footprint.py), which the learned claim decays toward.
    learned_on = models.CharField(max_length=200, blank=True, default="", editable=False)
    measured_gib = models.FloatField("memory measured (GiB)", null=True, blank=True, editable=False)
    # Asleep: what each replica's engine still holds (measured as it fell asleep: a sleeping
    # vLLM keeps its CUDA context and some buffers on the GPU), which the budget counts and
    # make-room frees by stopping it. None otherwise, or where it could not be measured.
    asleep_gib = models.FloatField(
        "memory held asleep (GiB)", null=True, blank=True, editable=False
    )
    # Seconds its starts took to become ready (a running mean of the last ones): what the
    # scheduler weighs as the cost of stopping it, and a waiting client's estimate.
    # Asleep: 1 (weights in host memory) or 2 (weights dropped); None otherwise.
    sleep_level = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    start_s = models.FloatField("measured start (s)", null=True, blank=True, editable=False)
    start_phase = models.CharField(max_length=120, blank=True, default="", editable=False)
    engine_urls = models.JSONField(default=list, blank=True)
    # Each replica's GPUs (device indices), as placed at its start; empty on a host without
    # GPUs and for an engine that takes none. Kept while it sleeps: it wakes where it ran.
    gpus = models.JSONField(default=list, blank=True)
    runtime_handle = models.JSONField(default=dict, blank=True)
    # Replicas running under autoscaling_config; 0: as a start brings up (its initial count).
    replicas = models.PositiveIntegerField(default=0)
    running_fingerprint = models.CharField(
        "configuration running (fingerprint)", max_length=64, blank=True, default=""
    )
    # The on-demand lease: a gateway that holds or just released slots keeps this in the
    # future, and no stop of an on-demand deployment is approved before it passes. It is
    # extended ahead of time, not per request, and a gateway that dies simply lets it lapse.
    lease_until = models.DateTimeField(null=True, blank=True)
    # Raised whenever past start failures are forgiven (a mode switch, a new configuration):
    # each gateway process's start backoff holds only while the row shows the value it
    # failed under, so the forgiveness reaches every process through the row it reads.
    failures_forgiven = models.PositiveIntegerField(default=0, editable=False)

    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            (
                "run_arbitrary_engine",
                "Can set what an engine runs on the host (command, image, binary, container"
                " options, environment)",
            )
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def effective_mode(self) -> str:
        return effective_mode_of(self.mode, self.system, self.autoscaling_config)

    @property
    def replica_count(self) -> int:
        """Replicas it runs (or a start brings up): num_replicas, or under autoscaling the
        count the autoscaler reached while it runs, else its initial count."""
        scaling = AutoscalingConfig.of(self.autoscaling_config)
        if scaling is None:
            return self.num_replicas
        running = self.state in (State.STARTING, State.READY, State.ASLEEP, State.STOPPING)
        return self.replicas if running and self.replicas else scaling.initial

    @property
    def is_on_demand(self) -> bool:
        return self.effective_mode == Mode.ON_DEMAND

    @property
    def effective_idle_timeout_s(self) -> int:
        return self.idle_timeout_s or settings.MSHIP_ONDEMAND_IDLE_TIMEOUT_S

    @property
    def engine_url(self) -> str:
        return self.engine_urls[0] if self.engine_urls else ""

    def snapshot(self) -> dict[str, Any]:
        """The audited view of a deployment: what an operator sets, plus its state."""
        data: dict[str, Any] = {field: getattr(self, field) for field in CONFIG_FIELDS}
        data.update(
            mode=self.mode,
            idle_timeout_s=self.idle_timeout_s,
            evictable=self.evictable,
            preload=self.preload,
            priority=self.priority,
            max_concurrency=self.max_concurrency,
            system=self.system,
            autoscaling_config=self.autoscaling_config,
            adapter_of=self.adapter_of.name if self.adapter_of is not None else None,
            state=self.state,
        )
        return data


class AuditEntry(models.Model):
    """NetBox's ObjectChange shape: who changed what, when, from what to what."""

    time = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    actor = models.CharField(max_length=150, help_text="The user's name or a system actor.")
    request_id = models.CharField(max_length=128, blank=True, default="")
    action = models.CharField(max_length=64, db_index=True)
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="audit"
    )
    object_repr = models.CharField(max_length=200, blank=True, default="")
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    text = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-time", "-id"]
        verbose_name_plural = "audit entries"

    def __str__(self) -> str:
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_repr}"


class DeploymentEvent(models.Model):
    time = models.DateTimeField(auto_now_add=True, db_index=True)
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    deployment_name = models.CharField(max_length=200)
    actor = models.CharField(max_length=150, default="system")
    kind = models.CharField(max_length=64, db_index=True)
    text = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-time", "-id"]

    def __str__(self) -> str:
        return f"{self.deployment_name}: {self.kind} {self.text}"
