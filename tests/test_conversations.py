"""Conversations with the official SDK: the Conversations API (create, retrieve, update,
delete; items listed with pagination, added, retrieved, deleted), and responses made in a
conversation reading its items as context and extending it when they complete."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from tests.conftest import wait_until
from tests.open_responses_schema import conforming_sdk

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return conforming_sdk(gateway_url, api_key())


def said(text: str, role: str = "user") -> Any:
    return {"type": "message", "role": role, "content": text}


def texts(items: Any) -> list[str]:
    return [part.text for item in items for part in item.content]


@pytest.mark.sample("responses")
def test_it_creates_reads_updates_and_deletes_a_conversation(client: openai.OpenAI) -> None:
    made = client.conversations.create(
        metadata={"topic": "demo"}, items=[said("hi"), said("hello", "assistant")]
    )
    assert made.id.startswith("conv_") and made.object == "conversation"
    assert made.metadata == {"topic": "demo"}
    assert client.conversations.retrieve(made.id).model_dump() == made.model_dump()
    updated = client.conversations.update(made.id, metadata={"topic": "other"})
    assert updated.metadata == {"topic": "other"}
    assert client.conversations.retrieve(made.id).metadata == {"topic": "other"}
    # Newest first by default, oldest first with order=asc.
    assert texts(client.conversations.items.list(made.id)) == ["hello", "hi"]
    assert texts(client.conversations.items.list(made.id, order="asc")) == ["hi", "hello"]
    deleted = client.conversations.delete(made.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (made.id, True, "conversation.deleted")
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.list(made.id)


def test_it_pages_adds_reads_and_deletes_items(client: openai.OpenAI) -> None:
    conversation = client.conversations.create()
    added = client.conversations.items.create(
        conversation.id, items=[said(f"m{n}") for n in range(5)]
    )
    assert texts(added.data) == [f"m{n}" for n in range(5)] and not added.has_more
    third = str(added.data[2].id)
    first = client.conversations.items.list(conversation.id, limit=2, order="asc")
    assert texts(first.data) == ["m0", "m1"] and first.has_more
    # The SDK's pager follows `after` through every page.
    everything = list(client.conversations.items.list(conversation.id, limit=2, order="asc"))
    assert texts(everything) == [f"m{n}" for n in range(5)]
    one = client.conversations.items.retrieve(third, conversation_id=conversation.id)
    assert texts([one]) == ["m2"]
    after_delete = client.conversations.items.delete(third, conversation_id=conversation.id)
    assert after_delete.id == conversation.id
    remaining = client.conversations.items.list(conversation.id, order="asc")
    assert texts(remaining) == ["m0", "m1", "m3", "m4"]
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(third, conversation_id=conversation.id)


def test_it_keeps_each_callers_conversations_apart(
    gateway_url: str, api_key: Callable[..., str]
) -> None:
    mine, theirs = (
        conforming_sdk(gateway_url, api_key("a")),
        conforming_sdk(gateway_url, api_key("b")),
    )
    conversation = mine.conversations.create(items=[said("secret")])
    with pytest.raises(openai.NotFoundError):
        theirs.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        theirs.conversations.items.list(conversation.id)
    with pytest.raises(openai.NotFoundError):
        theirs.conversations.delete(conversation.id)
    assert texts(mine.conversations.items.list(conversation.id)) == ["secret"]


def test_it_refuses_bad_conversation_requests_by_field(
    gateway_url: str, client: openai.OpenAI, api_key: Callable[..., str]
) -> None:
    with pytest.raises(openai.BadRequestError) as too_many:
        client.conversations.create(items=[said(str(n)) for n in range(21)])
    assert too_many.value.body["param"] == "items"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad_item:
        client.conversations.create(items=[said("no role") | {"role": None}])
    assert bad_item.value.body["param"] == "items[0].role"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad_metadata:
        client.conversations.create(metadata={"k": "v" * 513})
    assert bad_metadata.value.body["param"] == "metadata"  # type: ignore[index]
    conversation = client.conversations.create()
    with pytest.raises(openai.BadRequestError) as bad_after:
        client.conversations.items.list(conversation.id, after="item_nope")
    assert bad_after.value.body["param"] == "after"  # type: ignore[index]
    headers = {"authorization": f"Bearer {api_key()}"}
    url = f"{gateway_url}/v1/conversations/{conversation.id}"
    assert httpx.put(url, headers=headers).status_code == 405
    assert httpx.get(url + "/things", headers=headers).status_code == 404
    not_json = httpx.post(url, headers=headers, content=b"[1]")
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == (
        "invalid_request_error"
    )
    # Nothing was created by the refused requests.
    assert texts(client.conversations.items.list(conversation.id)) == []


@pytest.mark.sample("responses")
def test_it_reads_and_extends_the_conversation_of_a_response(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": "noted"})
    conversation = client.conversations.create(items=[said("my name is Ada")])
    first = client.responses.create(model="sim", input="remember it", conversation=conversation.id)
    assert first.conversation is not None and first.conversation.id == conversation.id
    assert engine_saw(sim) == ["my name is Ada", "remember it"]
    # Its input and output joined the conversation, in order.
    assert texts(client.conversations.items.list(conversation.id, order="asc")) == [
        "my name is Ada",
        "remember it",
        "noted",
    ]
    # The next response sees all of it ({id} works as the id does), streamed too.
    with client.responses.stream(
        model="sim", input="what is my name?", conversation={"id": conversation.id}
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == "noted"
    assert engine_saw(sim) == ["my name is Ada", "remember it", "noted", "what is my name?"]
    assert len(list(client.conversations.items.list(conversation.id))) == 5
    # A deleted item is no longer context.
    oldest = client.conversations.items.list(conversation.id, order="asc").data[0]
    client.conversations.items.delete(str(oldest.id), conversation_id=conversation.id)
    client.responses.create(model="sim", input="again", conversation=conversation.id, store=False)
    assert engine_saw(sim)[0] == "remember it"


def test_it_extends_a_conversation_only_with_a_turn_that_answered(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "x"})
    serving("broken", config={"fail_status": 500})
    conversation = client.conversations.create(items=[said("start")])
    with pytest.raises(openai.BadRequestError) as both:
        client.responses.create(
            model="sim", input="hi", conversation=conversation.id, previous_response_id="resp_x"
        )
    assert both.value.body["param"] == "conversation"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="sim", input="hi", conversation="conv_missing")
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model="broken", input="hi", conversation=conversation.id)
    with (
        pytest.raises(openai.InternalServerError),
        client.responses.stream(model="broken", input="hi", conversation=conversation.id),
    ):
        pass
    assert len(list(client.conversations.items.list(conversation.id))) == 1
    cut = client.responses.create(
        model="sim", input="more", conversation=conversation.id, max_output_tokens=1
    )
    assert cut.status == "incomplete"  # an answer cut short is still a turn
    assert len(list(client.conversations.items.list(conversation.id))) == 3


def test_it_extends_the_conversation_of_a_background_response_when_it_completes(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim", config={"reply": "later"})
    conversation = client.conversations.create(items=[said("start")])
    queued = client.responses.create(
        model="sim", input="in the background", conversation=conversation.id, background=True
    )
    assert queued.status == "queued"
    wait_until(lambda: client.responses.retrieve(queued.id).status == "completed", 10)
    assert texts(client.conversations.items.list(conversation.id, order="asc")) == [
        "start",
        "in the background",
        "later",
    ]


def engine_saw(deployment: Deployment) -> list[str]:
    deployment.refresh_from_db()
    body = httpx.get(deployment.engine_url + "/sim/last_chat_request").json()
    return [str(m["content"]) for m in body["messages"] if m["role"] != "system"]


def test_it_counts_the_input_tokens_of_a_turn_in_a_conversation(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    serving("sim")
    conversation = client.conversations.create(items=[said("my name is Ada")])
    counted = client.responses.input_tokens.count(
        model="sim", input="hi", conversation=conversation.id
    )
    assert counted.input_tokens == 4 + 1  # the conversation's items, then the input
