"""What a request tells the replica choice: its conversation and its prefix key."""

from __future__ import annotations

from openai_api.routing.hints import hint_of, response_key

LONG = "You keep the books of a small bakery. " * 60  # ~2,300 characters


def chat(*messages: tuple[str, str], **extra: object) -> dict[str, object]:
    return {"messages": [{"role": r, "content": c} for r, c in messages], **extra}


def test_it_keys_a_long_system_prompt_by_itself_and_a_short_one_with_the_opening() -> None:
    ada = hint_of(chat(("system", LONG), ("user", "I am Ada.")), {}, "1", 1000)
    grace = hint_of(chat(("system", LONG), ("user", "I am Grace.")), {}, "1", 1000)
    assert ada.prefix == grace.prefix and ada.prefix is not None and len(ada.prefix) == 1000
    short = [hint_of(chat(("system", "Be brief."), ("user", w)), {}, "1", 1000) for w in "ab"]
    assert short[0].prefix == "Be brief. a" and short[1].prefix == "Be brief. b"
    # Whitespace does not move a key; the conversations differ all the same.
    spaced = hint_of(
        chat(("system", LONG.replace(" ", "   ")), ("user", "I am Ada.")), {}, "1", 1000
    )
    assert spaced.prefix == ada.prefix
    assert ada.conversation != grace.conversation


def test_it_gives_every_turn_of_a_chat_the_same_conversation() -> None:
    first = chat(("system", "Be brief."), ("user", "Hi."))
    later = chat(
        ("system", "Be brief."), ("user", "Hi."), ("assistant", "Hello."), ("user", "And?")
    )
    before, after = hint_of(first, {}, "1", 1000), hint_of(later, {}, "1", 1000)
    assert (before.conversation, before.prefix) == (after.conversation, after.prefix)
    assert before.marks == after.marks[: len(before.marks)]  # its earlier state, marked
    # Another key, or another end user, is another conversation.
    assert hint_of(first, {}, "2", 1000).conversation != hint_of(first, {}, "1", 1000).conversation
    assert (
        hint_of({**first, "user": "u-9"}, {}, "1", 1000).conversation
        != hint_of(first, {}, "1", 1000).conversation
    )


def test_it_prefers_the_callers_session_then_the_conversation_then_the_chain() -> None:
    body = {"input": "Hi.", "conversation": "conv_1", "previous_response_id": "resp_1"}
    by_header = hint_of(body, {"x-modelship-session": "t-81"}, "1", 1000)
    assert (
        by_header.conversation
        == hint_of(chat(("user", "x")), {"x-modelship-session": "t-81"}, "1", 1000).conversation
    )
    by_conversation = hint_of(body, {}, "1", 1000)
    same = hint_of({"conversation": {"id": "conv_1"}}, {}, "1", 9)
    assert by_conversation.conversation == same.conversation
    # Another key naming the same conversation or response is another conversation.
    assert hint_of(body, {}, "2", 1000).conversation != by_conversation.conversation
    del body["conversation"]
    assert hint_of(body, {}, "1", 1000).conversation == response_key("1", "resp_1")
    assert hint_of(body, {}, "2", 1000).conversation == response_key("2", "resp_1")


def test_it_gives_no_keys_where_there_is_no_text() -> None:
    assert hint_of({"input": [1, 2, 3], "model": "e"}, {}, "1", 1000).prefix is None
    assert hint_of(None, {}, "1", 1000).conversation is None
    assert hint_of({"prompt": "Once upon"}, {}, "1", 1000) == hint_of(
        {"prompt": "Once upon"}, {}, "1", 1000
    )
    assert hint_of({"prompt": "Once upon"}, {}, "1", 1000).conversation is None  # one turn
    assert hint_of(chat(("system", LONG)), {}, "1", 0).prefix is None  # keys off


def test_it_reads_no_field_whole_whatever_its_size_or_type() -> None:
    huge = [1e-300] * 200_000
    for field in ("user", "safety_identifier"):  # not a string: no end user
        hint = hint_of({**chat(("user", "hi")), field: huge}, {}, "1", 1000)
        assert hint == hint_of(chat(("user", "hi")), {}, "1", 1000)
    big = "y" * 10_000_000
    keyed = hint_of({"instructions": big, "input": "x", "conversation": big}, {}, "1", 1000)
    assert keyed.prefix == "y" * 1000
    assert keyed.conversation == hint_of({"conversation": big[:256]}, {}, "1", 9).conversation


def test_it_reads_text_parts_and_stops_at_a_bounded_length() -> None:
    parts = [{"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": "x"}}]
    hint = hint_of({"messages": [{"role": "user", "content": parts}]}, {}, "1", 1000)
    assert hint.prefix == "Look:"
    huge = hint_of(chat(("system", "x " * 5_000_000), ("user", "hi")), {}, "1", 1000)
    assert huge.prefix is not None and len(huge.prefix) == 1000
