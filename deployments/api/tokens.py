"""/api tokens (`Authorization: Token …`), stored as their SHA-256 digest.

DRF's authtoken app kept every key in clear in the database and showed it in the admin:
whoever read a backup signed in as its user. Here a token is 40 random hex characters
(as DRF's, so existing clients and var/admin_token keep working once migration 0013 has
hashed the old keys), shown once when made; the database has only its digest, found by
its unique index and compared in constant time. A token of 160 random bits needs no salt
or slow hash: nothing about it can be guessed from a digest.

A wrong token counts as a failed sign-in from the client's address
(deployments/login_throttle.py): past the limit, every token from there is refused with a
429 until the window passes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import TYPE_CHECKING, Any

from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed, Throttled

from deployments import login_throttle
from deployments.auth_models import ApiToken

if TYPE_CHECKING:
    from django.http import HttpRequest


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue_token(user: Any) -> str:
    """A new token for `user`, replacing any it had; the token is returned once, here."""
    key = secrets.token_hex(20)
    ApiToken.objects.update_or_create(user=user, defaults={"digest": digest_of(key)})
    return key


class HashedTokenAuthentication(TokenAuthentication):
    keyword = "Token"

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        if not get_authorization_header(request).lower().startswith(b"token "):
            return None  # not a token: another class (a session, Basic auth) may sign in
        keys = login_throttle.keys_of(request, None)
        wait = login_throttle.wait_s(keys)
        if wait:
            raise Throttled(wait, login_throttle.refusal(wait))
        try:
            return super().authenticate(request)
        except AuthenticationFailed:
            login_throttle.failed(keys)
            raise

    def authenticate_credentials(self, key: str) -> tuple[Any, ApiToken]:
        digest = digest_of(key)
        token = ApiToken.objects.select_related("user").filter(digest=digest).first()
        if token is None or not hmac.compare_digest(token.digest, digest):
            raise AuthenticationFailed("Invalid token.")
        if not token.user.is_active:
            raise AuthenticationFailed("User inactive or deleted.")
        return token.user, token


def user_of_token(request: HttpRequest) -> Any | None:
    """The user a request's token signs in, or None (no token, a wrong one, throttled)."""
    try:
        found = HashedTokenAuthentication().authenticate(request)
    except (AuthenticationFailed, Throttled):
        return None
    return None if found is None else found[0]
