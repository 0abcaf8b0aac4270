from __future__ import annotations

from typing import Any, cast

from rest_framework import serializers

from deployments import display, hooks, kv_store
from deployments.api.fields import QUERY_NAMES, StrictFields, StrictIntegerField, StrictNumbers
from deployments.api.masking import MASKED_FIELDS, masked, may_see_secrets, unmasked
from deployments.engine_logs import MAX_TAIL
from deployments.fingerprint import CONFIG_FIELDS, deployment_fingerprint
from deployments.loaders import CONFIG_KEYS, LOADERS, EngineSpec
from deployments.memory import estimate_report, need_gib
from deployments.models import AuditEntry, Deployment, DeploymentEvent, Mode
from deployments.store.refs import suggestion

STATE_FIELDS = (
    "state",
    "start_phase",
    "start_s",
    "learned_gib",
    "learned_on",
    "measured_gib",
    "asleep_gib",
    "state_reason",
    "state_changed_at",
    "engine_urls",
    "replicas",
    "gpus",
    "pending_mode",
    "created",
    "updated",
)


MAX_REPLICA = 1000


class DeploymentSerializer(StrictFields, StrictNumbers, serializers.ModelSerializer):
    """Single-field checks only: those that span fields, clashing names and host access
    are the operations' own (deployments/operations.py), so the admin refuses the same."""

    # models.yaml's keys for what /api names otherwise: a loader's block is `config` here.
    other_spellings = {**dict.fromkeys(CONFIG_KEYS, "config"), "docker": "docker_options"}

    effective_mode = serializers.CharField(read_only=True)
    need_gib = serializers.SerializerMethodField()
    adapter_of = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Deployment.objects.all(),
        required=False,
        allow_null=True,
        help_text="The base deployment whose engine serves this LoRA adapter (its model is"
        " the adapter's file); its loader is the base's.",
    )
    memory_estimate = serializers.SerializerMethodField(
        help_text="What its engine will hold, read from its model's metadata before it starts"
        " (GiB: weights, cache, overhead), with a warning where memory_gib is below it; null"
        " where the model is not on this host."
    )
    config_current = serializers.SerializerMethodField(
        help_text="False while the running engine has an older configuration."
    )
    saved_conversations = serializers.SerializerMethodField(
        help_text="llama.cpp slot caches saved as its engine last stopped, waiting to be"
        " restored for their conversations' next turns (count, bytes on disk); null where"
        " it keeps none (deployments/kv_store.py)."
    )
    ondemand = serializers.SerializerMethodField(
        help_text="On-demand deployments: inflight, queued, queued_since, last_request_at and"
        " phase."
    )
    state_label = serializers.SerializerMethodField(
        help_text="The state in the words the admin and `modelship ps` show: the state, then"
        " what it is doing where that says more ('starting · pulling its container image',"
        " 'stopped · idle' for an on-demand deployment with no engine)."
    )
    litellm = serializers.SerializerMethodField(
        help_text="Its registration with the site's LiteLLM proxy (null: none configured)."
    )
    when_idle = serializers.SerializerMethodField(
        help_text="On demand, what an idle engine is given: sleep where it sleeps, else a stop"
        " (and why, where sleep mode was asked for); null for an always-on deployment."
    )

    class Meta:
        model = Deployment
        fields = (
            "id",
            *CONFIG_FIELDS,
            "autoscaling_config",
            "mode",
            "effective_mode",
            "idle_timeout_s",
            "evictable",
            "preload",
            "priority",
            "max_concurrency",
            "system",
            "responses",
            "adapter_of",
            "need_gib",
            "memory_estimate",
            "config_current",
            "saved_conversations",
            "ondemand",
            "when_idle",
            "litellm",
            "state_label",
            *STATE_FIELDS,
        )
        read_only_fields = STATE_FIELDS
        extra_kwargs = {
            # What operations.validate refuses, said where a client reads it.
            "name": {"help_text": "Served model name; unique among the names and aliases."},
            "loader": {
                "required": False,
                "help_text": "Required, but for a stored model (store:NAME): its format's.",
            },
            "model": {
                "help_text": "A path, a hub id, or a stored model: store:NAME (store:NAME/FILE"
                " for one file of it)."
            },
        }

    def shows_secrets(self) -> bool:
        request = self.context.get("request")
        return may_see_secrets(getattr(request, "user", None))

    def to_representation(self, instance: Deployment) -> dict[str, Any]:
        shown = dict(super().to_representation(instance))
        return shown if self.shows_secrets() else masked(shown)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is None and "loader" not in attrs and attrs.get("adapter_of"):
            attrs["loader"] = attrs["adapter_of"].loader  # an adapter's is its base's
            attrs.setdefault("usecase", attrs["adapter_of"].usecase)
        if self.instance is None and "loader" not in attrs:
            # A stored model's format suggests its loader and use (deployments/store/).
            loader, usecase = suggestion(attrs.get("model"))
            if loader is None:
                raise serializers.ValidationError({"loader": ["This field is required."]})
            attrs["loader"] = loader
            if "usecase" not in self.initial_data and usecase:
                attrs["usecase"] = usecase
        # A masked value sent back (deployments/api/masking.py) keeps what is stored.
        if self.instance is not None and not self.shows_secrets():
            for field in MASKED_FIELDS:
                if field in attrs:
                    attrs[field] = unmasked(attrs[field], getattr(self.instance, field))
        return attrs

    def get_memory_estimate(self, obj: Deployment) -> dict[str, Any] | None:
        return estimate_report(obj)

    def get_saved_conversations(self, obj: Deployment) -> dict[str, int] | None:
        if not kv_store.keeps(obj):
            return None
        count, size = kv_store.held(obj.name)
        return {"count": count, "bytes": size}

    def get_need_gib(self, obj: Deployment) -> float:
        return round(need_gib(obj), 3)

    def get_ondemand(self, obj: Deployment) -> dict[str, Any] | None:
        return hooks.reports.ondemand_status(obj)

    def get_state_label(self, obj: Deployment) -> str:
        return display.label_of(obj, hooks.reports.ondemand_status(obj))

    def get_when_idle(self, obj: Deployment) -> str | None:
        loader = LOADERS.get(obj.loader)
        if not obj.is_on_demand or loader is None:
            return None
        return loader.idle_action(EngineSpec.of(obj))

    def get_litellm(self, obj: Deployment) -> str | None:
        # Read once per request: a list shares its context dict with each row's serializer.
        context = cast("dict[str, Any]", self.context)
        if "litellm_statuses" not in context:
            context["litellm_statuses"] = hooks.reports.litellm_statuses()
        statuses = context["litellm_statuses"]
        return None if statuses is None else hooks.reports.litellm_status(obj.pk, statuses)

    def get_config_current(self, obj: Deployment) -> bool:
        return not obj.running_fingerprint or obj.running_fingerprint == deployment_fingerprint(obj)


class LogParams(StrictFields, serializers.Serializer):
    also_known = QUERY_NAMES

    tail = StrictIntegerField(min_value=1, max_value=MAX_TAIL, default=100)
    follow = serializers.BooleanField(default=False)
    replica = StrictIntegerField(min_value=0, max_value=MAX_REPLICA, default=0)


class ReplicaParams(StrictFields, serializers.Serializer):
    also_known = QUERY_NAMES

    replica = StrictIntegerField(min_value=0, max_value=MAX_REPLICA, default=0)


class ModeSerializer(StrictFields, serializers.Serializer):
    mode = serializers.ChoiceField(choices=Mode.choices)


class AuditEntrySerializer(serializers.ModelSerializer):
    # Null for a system actor (the reaper, a CLI run).
    user: serializers.StringRelatedField = serializers.StringRelatedField(allow_null=True)

    class Meta:
        model = AuditEntry
        fields = (
            "id",
            "time",
            "user",
            "actor",
            "request_id",
            "action",
            "deployment",
            "object_repr",
            "before",
            "after",
            "text",
        )


class DeploymentEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = DeploymentEvent
        fields = ("id", "time", "deployment", "deployment_name", "actor", "kind", "text")
