"""/api/stored-models/: the model store. POST pulls (202, the pull queued for the cluster),
GET shows each model and a running pull's progress, DELETE removes one no deployment uses;
/api/stored-models/disk/ is the store's disk. Pulling takes `add`, deleting `delete`; a
local path outside MSHIP_MODEL_DIRS also takes `run_arbitrary_engine`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from common.redact import redact_urls
from deployments.api.fields import StrictFields
from deployments.api.filters import StrictFilterSet
from deployments.host_access import RUN_ARBITRARY_ENGINE
from deployments.store import pulls
from deployments.store.disk import disk_summary
from deployments.store.models import STORE_NAME_PATTERN, STORE_NAME_RULE, PullState, StoredModel
from deployments.store.refs import suggested_for
from deployments.store.sources import default_name
from deployments.store.users import users_of

if TYPE_CHECKING:
    from rest_framework.request import Request


class StoredModelSerializer(StrictFields, serializers.ModelSerializer):
    name = serializers.RegexField(
        STORE_NAME_PATTERN,
        max_length=128,
        required=False,
        help_text="Its name in the store (store:NAME); from the source where not given.",
        error_messages={"invalid": STORE_NAME_RULE},
    )
    include = serializers.ListField(
        child=serializers.CharField(max_length=200), required=False, max_length=32
    )
    reference = serializers.CharField(read_only=True)
    eta_s = serializers.FloatField(read_only=True, allow_null=True)
    suggested = serializers.SerializerMethodField()
    used_by = serializers.SerializerMethodField()

    class Meta:
        model = StoredModel
        fields = (
            "id",
            "name",
            "reference",
            "source",
            "include",
            "state",
            "error",
            "bytes_done",
            "bytes_total",
            "rate_bps",
            "eta_s",
            "checksums",
            "path",
            "format",
            "size_bytes",
            "details",
            "suggested",
            "used_by",
            "created_by",
            "created",
            "started_at",
            "finished_at",
        )
        read_only_fields = tuple(f for f in fields if f not in ("name", "source", "include"))

    def get_suggested(self, obj: StoredModel) -> dict[str, str | None]:
        loader, usecase = suggested_for(obj)
        return {"loader": loader, "usecase": usecase}

    def get_used_by(self, obj: StoredModel) -> list[str]:
        return users_of(obj)

    def to_representation(self, instance: StoredModel) -> dict[str, Any]:
        # A source's credentials (user:password@, ?token=) are its pull's alone: shown to no
        # one once it is asked, nor in an error that quotes the URL.
        shown = dict(super().to_representation(instance))
        for field in ("source", "error"):
            if isinstance(shown.get(field), str):
                shown[field] = redact_urls(shown[field])
        return shown


class StoredModelFilter(StrictFilterSet):
    # Not `format`: DRF reads ?format= as the answer's renderer.
    class Meta:
        model = StoredModel
        fields = ("state",)


class StoredModelViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    queryset = StoredModel.objects.all()
    serializer_class = StoredModelSerializer
    filterset_class = StoredModelFilter

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        asked = pulls.ask(
            data.get("name") or default_name(data["source"]),
            data["source"],
            data.get("include") or [],
            actor=request.user.get_username(),
            user=request.user,
            may_reach_host=request.user.has_perm(RUN_ARBITRARY_ENGINE),
        )
        ready = asked.model.state == PullState.READY
        code = status.HTTP_200_OK if ready else status.HTTP_202_ACCEPTED
        return Response(self.get_serializer(asked.model).data, status=code)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        pulls.remove(self.get_object(), actor=request.user.get_username(), user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        responses=inline_serializer(
            "StoreDisk",
            {
                "path": serializers.CharField(),
                "models": serializers.IntegerField(),
                "used_bytes": serializers.IntegerField(),
                "free_bytes": serializers.IntegerField(),
                "total_bytes": serializers.IntegerField(),
            },
        )
    )
    @action(detail=False, methods=["get"])
    def disk(self, request: Request) -> Response:
        return Response(disk_summary())
