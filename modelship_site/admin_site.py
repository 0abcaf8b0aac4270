"""The admin's site: it opens on the dashboard (what runs where, how full each GPU is, what
is starting, waiting and failing), with the deployments first among the apps below it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin

from deployments.ray_cluster import cluster_summary
from deployments.sign_in import ThrottledAdminLoginForm
from ondemand.live import may_watch
from ondemand.live_rows import snapshot

if TYPE_CHECKING:
    from django.http import HttpRequest
    from django.template.response import TemplateResponse

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
            context["dashboard"] = {"rows": list(rows.values()), "host": host}
            context["ray"] = cluster_summary()
        return super().index(request, {**context, **(extra_context or {})})

    def get_app_list(self, request: HttpRequest, app_label: str | None = None) -> list[Any]:
        apps = super().get_app_list(request, app_label)
        rank = {label: n for n, label in enumerate(APP_ORDER)}
        return sorted(apps, key=lambda app: (rank.get(app["app_label"], len(rank)), app["name"]))
