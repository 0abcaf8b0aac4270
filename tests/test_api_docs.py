"""/api/docs/ works on a host with no internet: Swagger UI's assets come from the site."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.models import User
from django.test import Client


def test_it_serves_the_api_browser_and_its_assets_from_the_site(db: None) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("ops", "o@example.com", "pw-123456"))
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png))"', html)
    assert assets, html
    for asset in assets:
        assert asset.startswith("/static/"), f"{asset} is not served by the site"
        served: Any = client.get(asset)
        assert served.status_code == 200, asset
        assert b"".join(served.streaming_content if served.streaming else [served.content])
    assert "cdn" not in html and "jsdelivr" not in html
