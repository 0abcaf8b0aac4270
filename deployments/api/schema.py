"""What the OpenAPI schema says beyond the serializers: the shapes of the answers that are
not a deployment (operations, the host, logs), and the errors every operation can answer.
Kept true by tests/test_fuzz_api.py, which checks every answer against this schema."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

ERRORS = {
    "400": "Invalid input: {field: [messages]} or {detail}.",
    "401": "Not signed in (session or token).",
    "403": "Signed in, but without the permission this needs.",
    "404": "No such object.",
}


class OperationAnswer(serializers.Serializer):
    """A start, stop, sleep, wake or removal: queued (202) or already done (200)."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    status = serializers.CharField(help_text="queued, or the state it already is in")


class ConflictAnswer(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.CharField(required=False)
    state = serializers.CharField(required=False)
    shortfall_gib = serializers.FloatField(required=False)
    need_gib = serializers.FloatField(required=False)
    free_gib = serializers.FloatField(required=False)
    capacity_gib = serializers.FloatField(required=False)
    gpus = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="On a GPU host: each device's index, need_gib, free_gib and short_gib.",
    )


class GpuHolding(serializers.Serializer):
    name = serializers.CharField()
    holding_gib = serializers.FloatField()


class GpuReading(serializers.Serializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField(allow_blank=True)
    name = serializers.CharField()
    total_gib = serializers.FloatField()
    held_gib = serializers.FloatField(help_text="What Modelship's deployments hold on it.")
    used_gib = serializers.FloatField(
        allow_null=True, help_text="In use as the driver reports; null for a declared GPU."
    )
    free_gib = serializers.FloatField()
    deployments = GpuHolding(many=True)


class Holding(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField()
    mode = serializers.CharField()
    holding_gib = serializers.FloatField()
    gpus = serializers.ListField(child=serializers.ListField(child=serializers.IntegerField()))


class TargetsAnswer(serializers.Serializer):
    targets = serializers.ListField(child=serializers.CharField(), help_text="host:port")
    labels = serializers.DictField(
        child=serializers.CharField(),
        help_text="deployment, replica, loader; __meta_modelship_metrics_path: the engine's"
        " metrics through Modelship (GET /api/deployments/{id}/metrics/?replica=N)",
    )


class RayReplica(serializers.Serializer):
    name = serializers.CharField()
    replica = serializers.IntegerField()
    url = serializers.CharField()


class RayNode(serializers.Serializer):
    node_id = serializers.CharField()
    ip = serializers.CharField()
    head = serializers.BooleanField()
    state = serializers.CharField(help_text="alive or dead")
    gpus = serializers.FloatField()
    gpus_used = serializers.FloatField()
    memory_gib = serializers.FloatField()
    memory_used_gib = serializers.FloatField()
    resources = serializers.DictField(help_text="custom resources: {name: {used, total}}")
    deployments = RayReplica(many=True)


class RayCluster(serializers.Serializer):
    address = serializers.CharField()
    reachable = serializers.BooleanField()
    error = serializers.CharField(allow_null=True)
    nodes = RayNode(many=True)


class HostAnswer(serializers.Serializer):
    capacity_gib = serializers.FloatField()
    held_gib = serializers.FloatField()
    free_gib = serializers.FloatField()
    on_demand_capacity_gib = serializers.FloatField()
    used_gib = serializers.FloatField(allow_null=True)
    placement = serializers.CharField(help_text="per GPU (pack), or one pool")
    gpus = GpuReading(many=True)
    deployments = Holding(many=True)
    ray = RayCluster(allow_null=True, help_text="the Ray cluster's nodes; null without Ray")
    ondemand = serializers.DictField(help_text="LiteLLM registration status", allow_null=True)


class ReplicaLog(serializers.Serializer):
    replica = serializers.IntegerField()
    lines = serializers.ListField(child=serializers.CharField(allow_blank=True))


class LogsAnswer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    replicas = ReplicaLog(many=True)


# One event of a stream: a log line (no event name), `end`, or `error` (a refusal).
SERVER_SENT_EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}


def add_error_responses(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular post-processing: every operation documents the errors it can
    answer (400 where it takes input, 404 where it names an object); one that streams
    server-sent events may answer them as an `error` event (deployments/api/renderers.py)."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = {
        "type": "object",
        "description": "{detail: message} or {field: [messages]}",
        "additionalProperties": True,
    }
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    error_event = {**error, "text/event-stream": {"schema": SERVER_SENT_EVENT}}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            streams = "text/event-stream" in responses.get("200", {}).get("content", {})
            codes = ["401", "403"]
            if "{" in path:
                codes.append("404")
            if method in ("post", "put", "patch") or operation.get("parameters"):
                codes.append("400")
            for code in codes:
                content = error_event if streams else error
                responses.setdefault(code, {"description": ERRORS[code], "content": content})
    return result
