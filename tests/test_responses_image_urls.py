"""Images a Responses input names by URL, with the official SDK: the gateway fetches them under
the MCP egress policy and the engine gets data: URLs, never the caller's URL; a URL the policy
refuses (loopback, a cloud's metadata endpoint) is a 400 naming the part, and nothing is
fetched; a fetch that is not an image, too big or redirected is a 400 too."""

from __future__ import annotations

import base64
import http.server
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.local_http import local_http
from tests.open_responses_schema import conforming_sdk

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)


class ImageHost(http.server.BaseHTTPRequestHandler):
    """/pixel.png, /page.html, /big.png (64 KiB) and /moved (a redirect to /pixel.png)."""

    visits: list[str]

    def do_GET(self) -> None:
        self.visits.append(self.path)
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("location", "/pixel.png")
            self.end_headers()
            return
        body, kind = {
            "/pixel.png": (PNG, "image/png"),
            "/big.png": (PNG + bytes(65536), "image/png"),
            "/page.html": (b"<html>not an image</html>", "text/html"),
        }.get(self.path, (b"", "text/plain"))
        self.send_response(200 if body else 404)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def image_host() -> Iterator[tuple[str, list[str]]]:
    """An image server on this machine: its URL and the paths it was asked for."""
    visits: list[str] = []
    with local_http(type("Handler", (ImageHost,), {"visits": visits})) as url:
        yield url, visits


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return conforming_sdk(gateway_url, api_key())


@pytest.fixture
def seeing(serving: Callable[..., Deployment]) -> Deployment:
    return serving("sim", config={"reply": "a pixel", "vision": True})


def look(url: str) -> Any:
    return [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what is it?"},
                {"type": "input_image", "image_url": url, "detail": "low"},
            ],
        }
    ]


def last_chat(deployment: Deployment) -> dict[str, Any] | None:
    deployment.refresh_from_db()
    answer = httpx.get(deployment.engine_url + "/sim/last_chat_request")
    return answer.json() if answer.status_code == 200 and answer.content else None


def refusal(client: openai.OpenAI, url: str) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model="sim", input=look(url))
    error: dict[str, Any] = refused.value.body  # type: ignore[assignment]
    return error


def test_it_refuses_image_urls_the_egress_policy_refuses_before_any_fetch(
    client: openai.OpenAI, seeing: Deployment, image_host: tuple[str, list[str]]
) -> None:
    host, visits = image_host
    before = last_chat(seeing)
    for url in (
        f"{host}/pixel.png",
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://[::ffff:127.0.0.1]:9/x.png",
        "http://2130706433/x.png",  # 127.0.0.1 as one decimal number
    ):
        error = refusal(client, url)
        assert error["param"] == "input[0].content[1].image_url", url
        assert error["code"] == "invalid_image_url"
        assert "cannot be used" in error["message"]
    assert (
        "metadata endpoints are never reachable"
        in refusal(client, "http://169.254.169.254/latest/")["message"]
    )
    assert visits == []
    assert last_chat(seeing) == before  # the engine was never called


def test_it_hands_the_engine_the_image_it_fetched_as_a_data_url(
    client: openai.OpenAI,
    seeing: Deployment,
    image_host: tuple[str, list[str]],
    settings: Any,
) -> None:
    host, visits = image_host
    settings.MSHIP_MCP_ALLOWED_HOSTS = ["127.0.0.1"]  # the site's own image host, allowed
    url = f"{host}/pixel.png"
    answer = client.responses.create(model="sim", input=look(url))
    assert answer.output_text == "a pixel"
    sent = last_chat(seeing)
    assert sent is not None
    inline = "data:image/png;base64," + base64.b64encode(PNG).decode()
    assert sent["messages"][0]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": inline, "detail": "low"},
    }
    assert visits == ["/pixel.png"]
    # What was stored is what the caller sent; a continuation fetches it again.
    [item] = client.responses.input_items.list(answer.id).data
    assert item.model_dump()["content"][1]["image_url"] == url
    client.responses.create(model="sim", input="and now?", previous_response_id=answer.id)
    assert visits == ["/pixel.png", "/pixel.png"]
    again = last_chat(seeing)
    assert again is not None and again["messages"][0]["content"][1]["image_url"]["url"] == inline


def test_it_refuses_what_is_not_an_image_too_big_or_elsewhere(
    client: openai.OpenAI,
    seeing: Deployment,
    image_host: tuple[str, list[str]],
    settings: Any,
) -> None:
    host, visits = image_host
    settings.MSHIP_MCP_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.MSHIP_INPUT_IMAGE_MAX_BYTES = 32768
    before = last_chat(seeing)
    said = {
        path: refusal(client, host + path)["message"]
        for path in ("/page.html", "/big.png", "/moved", "/gone.png")
    }
    assert "not an image (text/html)" in said["/page.html"]
    assert "32768 bytes in all" in said["/big.png"]
    assert "redirects are not followed" in said["/moved"]
    assert "answered 404" in said["/gone.png"]
    assert visits == ["/page.html", "/big.png", "/moved", "/gone.png"]  # /pixel.png: never
    assert last_chat(seeing) == before
