"""Password sign-ins under the login throttle (deployments/login_throttle.py): the
authentication backend every password goes through (the admin's login form, /api's Basic
auth), and the admin's login form, which says why a throttled sign-in is refused."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied, ValidationError

from deployments import login_throttle

if TYPE_CHECKING:
    from django.contrib.auth.models import User
    from django.http import HttpRequest


class ThrottledModelBackend(ModelBackend):
    """Django's own backend, refusing while throttled and counting what fails.
    PermissionDenied stops authenticate() at once: no other backend is tried."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> User | None:
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        keys = login_throttle.keys_of(request, username)
        wait = login_throttle.wait_s(keys)
        if wait:
            raise PermissionDenied(login_throttle.refusal(wait))
        user = super().authenticate(request, username, password, **kwargs)
        if user is None:
            login_throttle.failed(keys)
        elif username:
            login_throttle.succeeded(username)
        return user


class ThrottledAdminLoginForm(AdminAuthenticationForm):
    """The admin's login form: a throttled sign-in is told so and how long to wait,
    instead of the usual wrong-password message."""

    def clean(self) -> dict[str, Any]:
        keys = login_throttle.keys_of(self.request, self.cleaned_data.get("username"))
        wait = login_throttle.wait_s(keys)
        if wait:
            raise ValidationError(login_throttle.refusal(wait), code="throttled")
        return super().clean()
