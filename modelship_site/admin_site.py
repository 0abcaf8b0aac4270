"""The admin's site: it opens on the dashboard (what runs where, how full each GPU is, what
is starting, waiting and failing), with the deployments first among the apps below it."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib import admin
from django.db import connection
from django.urls import path

from common.redact import redact_urls
from deployments.ray_cluster import cluster_summary
from deployments.sign_in import ThrottledAdminLoginForm
from ondemand.live import may_see_events, may_watch
from ondemand.live_rows import for_viewer, snapshot
from openai_api.usage.admin_page import usage_page

if TYPE_CHECKING:
    from django.http import HttpRequest
    from django.template.response import TemplateResponse
    from django.urls import URLPattern, URLResolver

# The Ray cluster's block waits this long for its dashboard; the page does not wait longer.
RAY_WAIT_S = 2.0

# The apps in the order an operator looks for them; any other app follows, by name.
APP_ORDER = ("deployments", "openai_api", "auth", "django_q")


class ModelshipAdminSite(admin.AdminSite):
    site_header = "Modelship"
    site_title = "Modelship"
    index_title = "Dashboard"
    site_url = "/admin/"  # "View site": the dashboard (the site has no other front page)
    index_template = "admin/dashboard.html"
    # The dashboard and the header lead everywhere; the sidebar would take a fifth of the
    # list's width.
    enable_nav_sidebar = False
    # Says so when failed sign-ins have throttled a login (deployments/login_throttle.py).
    login_form = ThrottledAdminLoginForm

    def index(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> TemplateResponse:
        context: dict[str, Any] = {}
        if may_watch(request.user):
            rows, host = snapshot()
            host = for_viewer(host, may_see_events(request.user))
            context["dashboard"] = {"rows": list(rows.values()), "host": host}
            context["ray"] = ray_block()
        return super().index(request, {**context, **(extra_context or {})})

    def get_urls(self) -> list[URLResolver | URLPattern]:
        # /admin/usage/: tokens and GPU-seconds per team, key and model, and the budgets
        # (openai_api/usage/admin_page.py); linked from every page's header.
        usage = path("usage/", self.admin_view(self.usage_view), name="usage")
        return [usage, *super().get_urls()]

    def usage_view(self, request: HttpRequest) -> TemplateResponse:
        return usage_page(request, self.each_context(request))

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[Any]:
        apps = super().get_app_list(request, app_label)
        rank = {label: n for n, label in enumerate(APP_ORDER)}
        return sorted(apps, key=lambda app: (rank.get(app["app_label"], len(rank)), app["name"]))


def ray_block() -> dict[str, Any] | None:
    """The Ray cluster as /api/host shows it (credentials in its address redacted), or that
    it did not answer in time: a dashboard that does not answer holds no page for long."""
    if not settings.MSHIP_RAY_ADDRESS:
        return None
    done: concurrent.futures.Future[dict[str, Any] | None] = concurrent.futures.Future()

    def read() -> None:
        try:
            done.set_result(cluster_summary())
        except Exception as exc:  # told on the page, as an unreachable cluster is
            done.set_exception(exc)
        finally:
            connection.close()

    threading.Thread(target=read, name="modelship-ray-block", daemon=True).start()
    try:
        found = done.result(timeout=RAY_WAIT_S)
    except concurrent.futures.TimeoutError:
        found = unreachable(f"no answer from the Ray dashboard within {RAY_WAIT_S:g} s")
    except Exception as exc:
        found = unreachable(str(exc))
    return None if found is None else dict(redact_urls(found))


def unreachable(error: str) -> dict[str, Any]:
    """The cluster as cluster_summary says one that does not answer."""
    return {"address": settings.MSHIP_RAY_ADDRESS, "reachable": False, "error": error, "nodes": []}
