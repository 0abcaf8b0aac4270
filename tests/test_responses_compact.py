"""POST /v1/responses/compact with the official SDK (`client.responses.compact`) against the
simulated engine: the model summarises the conversation once, the answer is the user's
messages and a compaction item, and a new response goes on from that window; the item is
the caller's alone and cannot be altered."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from openai_api.errors import GatewayError
from openai_api.responses.compact import PROMPT
from openai_api.responses.compaction import SUMMARY_HEADING, check, new_item
from tests.open_responses_schema import conforming_sdk

if TYPE_CHECKING:
    from collections.abc import Callable

    from deployments.models import Deployment

pytestmark = pytest.mark.usefixtures("engines")
SUMMARY = "launch on Tuesday after support knows"


@pytest.fixture
def client(gateway_url: str, api_key: Callable[..., str]) -> openai.OpenAI:
    return conforming_sdk(gateway_url, api_key())


def engine_saw(deployment: Deployment) -> list[tuple[str, str]]:
    deployment.refresh_from_db()
    body = httpx.get(deployment.engine_url + "/sim/last_chat_request").json()
    return [(m["role"], str(m["content"])) for m in body["messages"]]


def served(deployment: Deployment) -> int:
    deployment.refresh_from_db()
    return int(httpx.get(deployment.engine_url + "/sim/stats").json()["served"])


def window(compacted: Any) -> list[Any]:
    """A compaction's output as the input of the next request, as a client passes it on."""
    return [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]


def test_it_compacts_a_conversation_and_a_new_response_goes_on_from_it(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": SUMMARY})
    first = client.responses.create(model="sim", input="We launch on Tuesday.")
    compacted = client.responses.compact(
        model="sim",
        previous_response_id=first.id,
        input=[{"role": "user", "content": "Tell support first."}],
        instructions="Be brief.",
        prompt_cache_key="launch",
    )
    # The model was asked once, with the whole conversation and then the request to compact.
    assert engine_saw(sim) == [
        ("system", "Be brief."),
        ("user", "We launch on Tuesday."),
        ("assistant", SUMMARY),
        ("user", "Tell support first."),
        ("user", PROMPT),
    ]
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    assert [item.type for item in compacted.output] == ["message", "message", "compaction"]
    kept = [item for item in compacted.output if item.type == "message"]
    assert [(m.role, m.content[0].text) for m in kept] == [  # type: ignore[union-attr]
        ("user", "We launch on Tuesday."),
        ("user", "Tell support first."),
    ]
    assert compacted.usage.output_tokens == len(SUMMARY.split())
    assert compacted.usage.total_tokens == compacted.usage.input_tokens + len(SUMMARY.split())
    # A new chain from the window: the summary stands for what the model said and did.
    after = client.responses.create(
        model="sim", input=[*window(compacted), {"role": "user", "content": "And now?"}]
    )
    assert after.status == "completed"
    assert engine_saw(sim) == [
        ("user", "We launch on Tuesday."),
        ("user", "Tell support first."),
        ("assistant", SUMMARY_HEADING + SUMMARY),
        ("user", "And now?"),
    ]
    # ... and the response that holds the compaction item is continued like any other.
    client.responses.create(model="sim", input="Next?", previous_response_id=after.id)
    assert engine_saw(sim)[2:] == [
        ("assistant", SUMMARY_HEADING + SUMMARY),
        ("user", "And now?"),
        ("assistant", SUMMARY),
        ("user", "Next?"),
    ]


def test_it_refuses_a_compaction_without_a_model_or_anything_to_compact(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim")
    key = api_key()

    def compact(body: dict[str, Any], key: str = key) -> httpx.Response:
        return httpx.post(
            gateway_url + "/v1/responses/compact",
            json=body,
            headers={"authorization": f"Bearer {key}"},
            timeout=60,
        )

    no_model = compact({"input": [{"role": "user", "content": "Compact this conversation."}]})
    nothing = compact({"model": "sim"})
    bad_input = compact({"model": "sim", "input": 5})
    unknown_model = compact({"model": "nope", "input": "x"})
    no_key = compact({"model": "sim", "input": "x"}, key="msk-nope-nope")
    assert [(a.status_code, a.json()["error"]["code"]) for a in (no_model, nothing, bad_input)] == [
        (400, "missing_model"),
        (400, "invalid_request"),
        (400, "invalid_request"),
    ]
    assert nothing.json()["error"]["param"] == bad_input.json()["error"]["param"] == "input"
    assert unknown_model.status_code == 404 and no_key.status_code == 401
    assert served(sim) == 0


def test_it_answers_502_where_the_model_writes_no_summary(
    client: openai.OpenAI, serving: Callable[..., Deployment]
) -> None:
    """An empty summary would make a compaction item that drops the conversation silently."""
    mute = serving("mute", config={"max_tokens": 0})
    with pytest.raises(openai.APIStatusError) as failed:
        client.responses.compact(model="mute", input="remember the launch date: Tuesday")
    assert (failed.value.status_code, failed.value.code) == (502, "empty_summary")
    assert served(mute) == 1  # the model was asked, once


def test_it_keeps_compactions_to_their_caller_and_refuses_an_altered_one(
    gateway_url: str, api_key: Callable[..., str], serving: Callable[..., Deployment]
) -> None:
    sim = serving("sim", config={"reply": SUMMARY})
    alice = conforming_sdk(gateway_url, api_key("alice"))
    bob = conforming_sdk(gateway_url, api_key("bob"))
    mine = alice.responses.create(model="sim", input="secret plans")
    with pytest.raises(openai.NotFoundError):
        bob.responses.compact(model="sim", previous_response_id=mine.id)
    compacted = alice.responses.compact(model="sim", previous_response_id=mine.id)
    before = served(sim)
    *_, item = window(compacted)
    content = item["encrypted_content"]
    altered: Any = {
        **item,
        "encrypted_content": content[:-2] + ("AA" if content[-2:] != "AA" else "BB"),
    }
    for caller, compaction in ((bob, item), (alice, altered)):
        with pytest.raises(openai.BadRequestError) as refused:
            caller.responses.create(model="sim", input=[compaction])
        assert refused.value.body["param"] == "input[0].encrypted_content"  # type: ignore[index]
    assert served(sim) == before
    assert alice.responses.create(model="sim", input=[item]).status == "completed"


def test_it_keeps_a_compaction_its_callers_across_a_secret_key_rotation(settings: Any) -> None:
    """Django signs with the new key and still reads the old (SECRET_KEY_FALLBACKS): an item
    made before the rotation is still its caller's, and still nobody else's."""
    item = new_item("alice", SUMMARY)
    settings.SECRET_KEY_FALLBACKS = [settings.SECRET_KEY]
    settings.SECRET_KEY = "rotated-" + settings.SECRET_KEY
    check("alice", [item])
    with pytest.raises(GatewayError):
        check("bob", [item])
    settings.SECRET_KEY_FALLBACKS = []  # the old key retired: its items with it
    with pytest.raises(GatewayError):
        check("alice", [item])
