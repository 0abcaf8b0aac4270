"""The gateway's inference endpoints, each with its traits, in one place.

The /v1 router, the /ondemand router, the queued notice and the health probe read this
table; adding an endpoint is one entry here (and, where a loader's engine serves it, one
path in that loader's `endpoints`). Every endpoint here is a POST that takes a slot of the
deployment's engine: it is counted, queued for memory and starts an on-demand model.
"""

from __future__ import annotations

from dataclasses import dataclass

GENERATE = frozenset({"generate"})
AUDIO_IN = frozenset({"transcription", "translation"})


@dataclass(frozen=True)
class Endpoint:
    path: str  # under /v1
    usecases: frozenset[str]  # the deployments' use cases whose engines may serve it
    public: bool = True  # served on /v1 by the model's name
    ondemand: bool = True  # served on /ondemand/{id}/v1, the address LiteLLM calls
    unversioned: bool = False  # also served at /{path} (vLLM's rerank and score)
    streams: bool = False  # answers as server-sent events when the body asks for a stream
    # The queued notice (a request that waits for memory is told so): as a first SSE chunk
    # of a stream, and prepended to a plain answer's text.
    notice_streamed: bool = False
    notice_plain: bool = False
    # LiteLLM's health probe gets an empty answer of this endpoint's shape (plain, and as
    # a stream where `probe_streams`), made by the gateway without a slot.
    probe: bool = False
    probe_streams: bool = False


def text_generation(path: str) -> Endpoint:
    """OpenAI's text generation endpoints: every trait, both ways (streamed and plain)."""
    return Endpoint(
        path,
        GENERATE,
        streams=True,
        notice_streamed=True,
        notice_plain=True,
        probe=True,
        probe_streams=True,
    )


ENDPOINTS: dict[str, Endpoint] = {
    e.path: e
    for e in (
        text_generation("chat/completions"),
        text_generation("completions"),
        Endpoint("responses", GENERATE, streams=True, notice_plain=True, probe=True),
        Endpoint("messages", GENERATE, streams=True, probe=True),
        Endpoint("chat/completions/batch", GENERATE, public=False),
        Endpoint("embeddings", frozenset({"embed"}), probe=True),
        Endpoint("rerank", frozenset({"embed"}), unversioned=True),
        Endpoint("score", frozenset({"embed"}), unversioned=True),
        # A Whisper deployment transcribes and translates, whichever it was declared for.
        Endpoint("audio/transcriptions", AUDIO_IN),
        Endpoint("audio/translations", AUDIO_IN),
        Endpoint("audio/speech", frozenset({"tts"}), ondemand=False),
        Endpoint("images/generations", frozenset({"image"}), ondemand=False),
        Endpoint("images/edits", frozenset({"image"}), ondemand=False),
    )
}

PUBLIC = frozenset(path for path, e in ENDPOINTS.items() if e.public)
ONDEMAND = frozenset(path for path, e in ENDPOINTS.items() if e.ondemand)
UNVERSIONED = {f"/{path}": path for path, e in ENDPOINTS.items() if e.unversioned}


def notice_eligible(path: str, streaming: bool) -> bool:
    endpoint = ENDPOINTS.get(path)
    if endpoint is None:
        return False
    return endpoint.notice_streamed if streaming else endpoint.notice_plain
