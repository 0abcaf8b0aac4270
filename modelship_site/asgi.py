"""ASGI entry point: Channels routes protocols; HTTP goes to Django for now.

The public /v1 and /ondemand gateways are mounted here, ahead of Django's middleware and URL
stack, by the gateway issues.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "modelship_site.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter  # noqa: E402

application = ProtocolTypeRouter({"http": django_asgi_app})
