"""Django's admin, on Modelship's site (modelship_site/admin_site.py): INSTALLED_APPS names
this config in the place of django.contrib.admin."""

from __future__ import annotations

from django.contrib.admin.apps import AdminConfig


class ModelshipAdminConfig(AdminConfig):
    default_site = "modelship_site.admin_site.ModelshipAdminSite"
