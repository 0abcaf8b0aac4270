"""Images and files in Responses input, with the official SDK: `input_image` and
`input_file` parts become the engine's chat parts (image_url, file) for a model that takes
them, and a model that does not is a 400 naming the part, before the engine is called."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.open_responses_schema import conforming_sdk

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")
# A 1x1 PNG.
PIXEL = (
    "data:image/png;base64,"
    + base64.b64encode(
        bytes.fromhex(
            "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
            "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
        )
    ).decode()
)
PDF = "data:application/pdf;base64," + base64.b64encode(b"%PDF-1.4\n%%EOF\n").decode()


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return conforming_sdk(gateway_url, api_key())


def look(*parts: dict[str, Any]) -> Any:
    return [{"role": "user", "content": [{"type": "input_text", "text": "what is it?"}, *parts]}]


def sent_to(deployment: Deployment) -> list[dict[str, Any]]:
    deployment.refresh_from_db()
    body = httpx.get(deployment.engine_url + "/sim/last_chat_request").json()
    return list(body["messages"])


def test_it_hands_images_and_files_to_a_model_that_takes_them(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": "a pixel", "vision": True})
    answer = client.responses.create(
        model="sim",
        input=look(
            {"type": "input_image", "image_url": PIXEL, "detail": "low"},
            {"type": "input_file", "file_data": PDF, "filename": "note.pdf"},
        ),
    )
    assert answer.output_text == "a pixel"
    [message] = sent_to(sim)
    assert message["content"] == [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": PIXEL, "detail": "low"}},
        {"type": "file", "file": {"file_data": PDF, "filename": "note.pdf"}},
    ]
    # A continuation keeps the earlier image; text-only turns stay plain strings.
    client.responses.create(model="sim", input="and now?", previous_response_id=answer.id)
    first, reply, follow_up = sent_to(sim)
    assert first["content"][1]["type"] == "image_url"
    assert (reply["content"], follow_up["content"]) == ("a pixel", "and now?")


def test_it_refuses_images_for_a_model_that_does_not_take_them(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("blind", config={"reply": "?"})
    seeing = serving("sim", config={"reply": "a pixel", "vision": True})
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="blind", input=look({"type": "input_image", "image_url": PIXEL})
        )
    assert refused.value.body["param"] == "input[0].content[1]"  # type: ignore[index]
    assert "'blind' does not take images" in str(refused.value)
    # An image an earlier turn holds is refused too, naming where it came from.
    earlier = client.responses.create(
        model="sim", input=look({"type": "input_image", "image_url": PIXEL})
    )
    with pytest.raises(openai.BadRequestError) as inherited:
        client.responses.create(model="blind", input="and?", previous_response_id=earlier.id)
    assert inherited.value.body["param"] == "previous_response_id"  # type: ignore[index]
    # A file to a model whose engine reads none (vLLM's and llama.cpp's chats refuse them).
    with pytest.raises(openai.BadRequestError) as no_files:
        client.responses.create(
            model="blind",
            input=look({"type": "input_file", "file_data": PDF, "filename": "note.pdf"}),
        )
    assert no_files.value.body["param"] == "input[0].content[1]"  # type: ignore[index]
    assert "'blind' does not read files" in str(no_files.value)
    assert len(sent_to(seeing)) == 1  # nothing refused reached an engine


def test_it_refuses_parts_that_name_what_is_not_here(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"vision": True})
    for part, param in (
        ({"type": "input_image", "file_id": "file-1"}, "input[0].content[1]"),
        ({"type": "input_image", "image_url": "file:///etc/passwd"}, "input[0].content[1]"),
        (
            {"type": "input_image", "image_url": PIXEL, "detail": "max"},
            "input[0].content[1].detail",
        ),
        ({"type": "input_file", "file_url": "https://example.com/a.pdf"}, "input[0].content[1]"),
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model="sim", input=look(part))
        assert refused.value.body["param"] == param, part  # type: ignore[index]
