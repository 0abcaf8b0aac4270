"""POST /api/apply: a models.yaml applied through the API (`modelship deploy`), as
`manage.py deploy` applies it: all or nothing, audited as the caller, the engine work queued
for the cluster. The answer names what was created, updated, unchanged and removed, and the
ids to follow."""

from __future__ import annotations

from typing import TYPE_CHECKING

import yaml
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.decorators import api_view, permission_classes
from rest_framework.response import Response

from deployments.api.fields import StrictFields
from deployments.api.permissions import ApplyPermission
from deployments.apply import apply, clashes_with_others
from deployments.models import Deployment
from deployments.models_yaml import ModelsFileError, parse
from deployments.task_queue import enqueue

if TYPE_CHECKING:
    from rest_framework.request import Request


class ApplyRequest(StrictFields, serializers.Serializer):
    file = serializers.CharField(help_text="The models.yaml, as text.", trim_whitespace=False)
    reconcile = serializers.BooleanField(
        default=False, help_text="Remove deployments the file does not name."
    )
    replace_strategy = serializers.ChoiceField(
        choices=["blue_green", "stop_start"], required=False, allow_null=True
    )


class ApplyAnswer(serializers.Serializer):
    created = serializers.ListField(child=serializers.CharField())
    updated = serializers.ListField(child=serializers.CharField())
    unchanged = serializers.ListField(child=serializers.CharField())
    removed = serializers.ListField(child=serializers.CharField())
    ids = serializers.DictField(child=serializers.IntegerField(), help_text="name: id")
    queued = serializers.IntegerField(help_text="Engine jobs queued for the cluster.")


@extend_schema(request=ApplyRequest, responses={200: ApplyAnswer})
@api_view(["POST"])
@permission_classes([ApplyPermission])
def apply_file(request: Request) -> Response:
    body = ApplyRequest(data=request.data)
    body.is_valid(raise_exception=True)
    try:
        document = yaml.safe_load(body.validated_data["file"])
        entries = parse(document)
        reconcile = body.validated_data["reconcile"]
        clashes = clashes_with_others(entries, reconcile=reconcile)
        if clashes:
            raise ModelsFileError(clashes)
    except yaml.YAMLError as exc:
        return problems([f"not valid YAML: {exc}"])
    except ModelsFileError as exc:
        return problems(exc.problems)
    # A refusal (host access, a clash) is answered by the API's exception handler.
    outcome = apply(
        entries,
        reconcile=reconcile,
        actor=request.user.get_username(),
        user=request.user,
        strategy=body.validated_data.get("replace_strategy"),
    )
    for job in outcome.jobs:
        enqueue(job.task, job.deployment_id, *job.args)
    names = [e["name"] for e in entries]
    ids = dict(Deployment.objects.filter(name__in=names).values_list("name", "pk"))
    return Response(
        {
            "created": outcome.created,
            "updated": outcome.updated,
            "unchanged": outcome.unchanged,
            "removed": outcome.removed,
            "ids": ids,
            "queued": len(outcome.jobs),
        }
    )


def problems(found: list[str]) -> Response:
    return Response(
        {"file": found, "detail": "Nothing was changed."}, status=status.HTTP_400_BAD_REQUEST
    )
