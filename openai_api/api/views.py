"""/api/keys/: the gateway's API keys for scripts and the `modelship` command. Create shows
the secret once; a key is restricted by editing it and revoked by its action, never deleted
(its audit rows name it). Every change goes through openai_api/keys.py and is audited.

/api/teams/: teams of keys and their budgets, changed through openai_api/teams.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db.models import Count
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import DjangoModelPermissions
from rest_framework.response import Response

from deployments.api.filters import IdFilter, StrictFilterSet, strict_boolean
from openai_api import keys, teams
from openai_api.api.serializers import ApiKeySerializer, IssuedKeySerializer, TeamSerializer
from openai_api.models import ApiKey
from openai_api.usage.models import Team

if TYPE_CHECKING:
    from rest_framework.request import Request


class KeyPermissions(DjangoModelPermissions):
    """Staff with the key model's permissions: view to list, add to create, change to
    restrict or revoke."""

    perms_map = {
        **DjangoModelPermissions.perms_map,
        "GET": ["%(app_label)s.view_%(model_name)s"],
        "POST": ["%(app_label)s.add_%(model_name)s"],
    }

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not user or not user.is_authenticated or not user.is_staff:
            return False
        if getattr(view, "action", None) == "revoke":
            return bool(user.has_perm("openai_api.change_apikey"))
        return super().has_permission(request, view)


class KeyFilter(StrictFilterSet):
    revoked = strict_boolean("revoked")  # `?revoked=null` is a 400, not every key
    team = IdFilter("team_id")

    class Meta:
        model = ApiKey
        fields = ("revoked", "name", "team")


class ApiKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    queryset = ApiKey.objects.select_related("team")
    serializer_class = ApiKeySerializer
    permission_classes = [KeyPermissions]
    filterset_class = KeyFilter

    @extend_schema(request=ApiKeySerializer, responses={201: IssuedKeySerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = self.get_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        fields = dict(body.validated_data)
        key, secret = keys.issue(request.user, fields.pop("name"), **fields)
        shown = IssuedKeySerializer(key).data
        return Response({**shown, "key": secret}, status=status.HTTP_201_CREATED)

    def perform_update(self, serializer: Any) -> None:
        serializer.instance = keys.change(
            self.request.user, serializer.instance, **serializer.validated_data
        )

    @extend_schema(request=None, responses={200: ApiKeySerializer})
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        key = self.get_object()
        keys.revoke(request.user, key)
        return Response(ApiKeySerializer(key).data)


class TeamFilter(StrictFilterSet):
    class Meta:
        model = Team
        fields = ("name",)


class TeamViewSet(viewsets.ModelViewSet):
    """Teams: their budgets bind all their keys together; removing one leaves its keys
    without a team. Needs the team model's permissions."""

    queryset = Team.objects.annotate(key_count=Count("keys"))
    serializer_class = TeamSerializer
    filterset_class = TeamFilter

    def perform_create(self, serializer: Any) -> None:
        serializer.instance = teams.create(self.request.user, **serializer.validated_data)

    def perform_update(self, serializer: Any) -> None:
        serializer.instance = teams.change(
            self.request.user, serializer.instance, **serializer.validated_data
        )

    def perform_destroy(self, instance: Team) -> None:
        teams.delete(self.request.user, instance)
