"""/api/keys/: the gateway's API keys for scripts and the `modelship` command. Create shows
the secret once; a key is restricted by editing it and revoked by its action, never deleted
(its audit rows name it). Every change goes through openai_api/keys.py and is audited."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import DjangoModelPermissions
from rest_framework.response import Response

from deployments.api.filters import StrictFilterSet, strict_boolean
from openai_api import keys
from openai_api.api.serializers import ApiKeySerializer, IssuedKeySerializer
from openai_api.models import ApiKey

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

    class Meta:
        model = ApiKey
        fields = ("revoked", "name")


class ApiKeyViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    queryset = ApiKey.objects.all()
    serializer_class = ApiKeySerializer
    permission_classes = [KeyPermissions]
    filterset_class = KeyFilter

    @extend_schema(request=ApiKeySerializer, responses={201: IssuedKeySerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        body = ApiKeySerializer(data=request.data)
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
