from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_view,
)
from rest_framework import status, viewsets
from rest_framework.decorators import action, api_view
from rest_framework.response import Response
from rest_framework.settings import api_settings

from common.redact import redact_urls
from deployments import hooks, operations
from deployments.api.filters import (
    IdFilter,
    StrictFilterSet,
    UtcDateTimeFilter,
    strict_boolean,
)
from deployments.api.renderers import EventStreamRenderer
from deployments.api.schema import (
    SERVER_SENT_EVENT,
    ConflictAnswer,
    HostAnswer,
    LogsAnswer,
    OperationAnswer,
    TargetsAnswer,
)
from deployments.api.serializers import (
    MAX_REPLICA,
    AuditEntrySerializer,
    DeploymentEventSerializer,
    DeploymentSerializer,
    LogParams,
    ModeSerializer,
    ReplicaParams,
)
from deployments.engine_logs import MAX_TAIL, follow, tails
from deployments.engine_metrics import engine_metrics_text, scrape_targets
from deployments.memory import host_summary
from deployments.models import AuditEntry, Deployment, DeploymentEvent
from deployments.ray_cluster import cluster_summary

if TYPE_CHECKING:
    from rest_framework.request import Request


def accepted(deployment: Deployment, outcome: str) -> Response:
    code = status.HTTP_202_ACCEPTED if outcome == operations.Outcome.QUEUED else status.HTTP_200_OK
    return Response({"id": deployment.pk, "name": deployment.name, "status": outcome}, status=code)


OPERATION_RESPONSES = {200: OperationAnswer, 202: OperationAnswer, 409: ConflictAnswer}
# The limits LogParams and ReplicaParams enforce, stated in the schema.
REPLICA = OpenApiParameter(
    "replica",
    {"type": "integer", "minimum": 0, "maximum": MAX_REPLICA},
    description="the replica (default 0)",
)


class DeploymentFilter(StrictFilterSet):
    system = strict_boolean("system")

    class Meta:
        model = Deployment
        fields = ("state", "loader", "usecase", "runtime", "mode", "system")


@extend_schema_view(destroy=extend_schema(responses={204: None, 202: OperationAnswer}))
class DeploymentViewSet(viewsets.ModelViewSet):
    queryset = Deployment.objects.all()
    serializer_class = DeploymentSerializer
    filterset_class = DeploymentFilter

    def perform_create(self, serializer: Any) -> None:
        deployment = Deployment(**serializer.validated_data)
        serializer.instance = operations.create(deployment, self.request.user)

    def perform_update(self, serializer: Any) -> None:
        deployment = serializer.instance
        for field, value in serializer.validated_data.items():
            setattr(deployment, field, value)
        serializer.instance = operations.update(deployment, self.request.user)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        deployment = self.get_object()
        outcome = operations.remove(deployment, request.user)
        if outcome == operations.Outcome.DELETED:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return accepted(deployment, outcome)

    def _operate(self, operation: Any) -> Response:
        # A refusal is answered by the API's exception handler (deployments/api/errors.py).
        deployment = self.get_object()
        return accepted(deployment, operation(deployment, self.request.user))

    @extend_schema(request=None, responses=OPERATION_RESPONSES)
    @action(detail=True, methods=["post"])
    def start(self, request: Request, pk: str | None = None) -> Response:
        return self._operate(operations.start)

    @extend_schema(request=None, responses=OPERATION_RESPONSES)
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        return self._operate(operations.stop)

    @extend_schema(request=None, responses=OPERATION_RESPONSES)
    @action(detail=True, methods=["post"])
    def sleep(self, request: Request, pk: str | None = None) -> Response:
        return self._operate(operations.sleep)

    @extend_schema(request=None, responses=OPERATION_RESPONSES)
    @action(detail=True, methods=["post"])
    def wake(self, request: Request, pk: str | None = None) -> Response:
        return self._operate(operations.wake)

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "tail",
                {"type": "integer", "minimum": 1, "maximum": MAX_TAIL},
                description=f"last lines (at most {MAX_TAIL})",
            ),
            OpenApiParameter("follow", bool, description="stream new lines as server-sent events"),
            REPLICA,
        ],
        responses={
            (200, "application/json"): LogsAnswer,
            (200, "text/event-stream"): SERVER_SENT_EVENT,
        },
    )
    @action(
        detail=True,
        methods=["get"],
        renderer_classes=[*api_settings.DEFAULT_RENDERER_CLASSES, EventStreamRenderer],
    )
    def logs(self, request: Request, pk: str | None = None) -> Any:
        deployment = self.get_object()
        params = LogParams(data=request.query_params)
        params.is_valid(raise_exception=True)
        if params.validated_data["follow"]:
            response = StreamingHttpResponse(
                follow(deployment, params.validated_data["replica"], request.user.pk or 0),
                content_type="text/event-stream",
            )
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"
            return response
        lines = params.validated_data["tail"]
        return Response(
            {"id": deployment.pk, "name": deployment.name, "replicas": tails(deployment, lines)}
        )

    @extend_schema(
        parameters=[REPLICA],
        responses={(200, "text/plain"): OpenApiTypes.STR, 409: ConflictAnswer},
    )
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str | None = None) -> HttpResponse:
        """The engine's own Prometheus metrics, as it serves them (vLLM's, llama.cpp's)."""
        deployment = self.get_object()
        params = ReplicaParams(data=request.query_params)
        params.is_valid(raise_exception=True)
        text = engine_metrics_text(deployment, params.validated_data["replica"])
        return HttpResponse(text, content_type="text/plain; version=0.0.4; charset=utf-8")

    @extend_schema(
        request=ModeSerializer, responses={200: DeploymentSerializer, 409: ConflictAnswer}
    )
    @action(detail=True, methods=["patch"])
    def mode(self, request: Request, pk: str | None = None) -> Response:
        body = ModeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        mode = body.validated_data["mode"]
        deployment = operations.set_mode(self.get_object(), mode, request.user)
        return Response(self.get_serializer(deployment).data)


class AuditFilter(StrictFilterSet):
    # By id, as the schema says: an id with no deployment finds nothing (not a 400).
    deployment = IdFilter("deployment_id")
    user = IdFilter("user_id")
    since = UtcDateTimeFilter(field_name="time", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="time", lookup_expr="lt")

    class Meta:
        model = AuditEntry
        fields = ("action", "actor", "deployment", "request_id", "user")


class AuditEntryViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = AuditEntry.objects.select_related("user")
    serializer_class = AuditEntrySerializer
    filterset_class = AuditFilter


class EventFilter(StrictFilterSet):
    deployment = IdFilter("deployment_id")
    since = UtcDateTimeFilter(field_name="time", lookup_expr="gte")
    until = UtcDateTimeFilter(field_name="time", lookup_expr="lt")

    class Meta:
        model = DeploymentEvent
        fields = ("deployment", "deployment_name", "kind", "actor")


class DeploymentEventViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = DeploymentEvent.objects.all()
    serializer_class = DeploymentEventSerializer
    filterset_class = EventFilter


@extend_schema(responses={200: TargetsAnswer(many=True)})
@api_view(["GET"])
def prometheus_targets(request: Request) -> Response:
    """Prometheus HTTP service discovery: every running engine that serves metrics."""
    return Response(scrape_targets())


@extend_schema(responses={200: HostAnswer})
@api_view(["GET"])
def host(request: Request) -> Response:
    # No URL's credentials: a Ray address or a LiteLLM error may quote user:pass@.
    return Response(
        redact_urls(
            {
                **host_summary(),
                "ray": cluster_summary(),
                "ondemand": hooks.reports.litellm_site_status(),
            }
        )
    )
