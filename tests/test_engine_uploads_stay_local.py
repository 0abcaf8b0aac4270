"""An upload is audio, never directions: the transcription engines' ffmpeg reads the upload
from a pipe and opens nothing it names (an HLS playlist's segments, an SDP's RTP stream),
and its words never reach the caller."""

from __future__ import annotations

import http.server
import shutil
import socket
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest

from deployments.engines.whisper_server import UNDECODABLE, make_app
from tests.local_http import local_app, local_http

if TYPE_CHECKING:
    import threading
    from collections.abc import AsyncIterator, Iterator

    import numpy as np

    from deployments.engines.transcript_formats import Segment

pytestmark = pytest.mark.skipif(not shutil.which("ffmpeg"), reason="ffmpeg decodes uploads")


class Silent:
    """A transcriber (as a plugin brings one) that hears nothing: the uploads here are
    refused before any transcriber runs."""

    languages = {"en"}

    def run(
        self, audio: np.ndarray, task: str, options: dict[str, Any], gone: threading.Event
    ) -> tuple[str, list[Segment]]:
        return "en", []


class Recorder(http.server.BaseHTTPRequestHandler):
    visits: list[str]

    def do_GET(self) -> None:
        self.visits.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"AccessKeyId: not-for-you")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metadata_lookalike() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server standing where a cloud's metadata endpoint would: its URL, and
    the paths anyone asked it for."""
    visits: list[str] = []
    with local_http(type("Handler", (Recorder,), {"visits": visits})) as url:
        yield url, visits


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    """The whisper engines' transcription routes, served on a port of this machine."""
    async with local_app(make_app(Silent(), ["ears"])) as port:
        yield f"http://127.0.0.1:{port}"


async def transcribe(url: str, upload: bytes, name: str) -> tuple[int, dict[str, Any]]:
    form = aiohttp.FormData()
    form.add_field("file", upload, filename=name, content_type="application/octet-stream")
    form.add_field("model", "ears")
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/audio/transcriptions", data=form) as answer,
    ):
        return answer.status, await answer.json()


async def test_it_never_follows_a_playlist_an_upload_names(
    engine: str, metadata_lookalike: tuple[str, list[str]]
) -> None:
    target, visits = metadata_lookalike
    playlist = (
        "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXT-X-MEDIA-SEQUENCE:0\n"
        f"#EXTINF:1.0,\n{target}/latest/meta-data/iam/credentials.ts\n#EXT-X-ENDLIST\n"
    )
    status, body = await transcribe(engine, playlist.encode(), "speech.m3u8")
    assert status == 400
    assert body["error"]["message"] == UNDECODABLE
    assert visits == []


async def test_it_opens_no_stream_an_sdp_upload_names(engine: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        sdp = (
            "v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 127.0.0.1\nt=0 0\n"
            f"m=audio {port} RTP/AVP 0\n"
        )
        status, body = await transcribe(engine, sdp.encode(), "speech.sdp")
        assert status == 400
        # ffmpeg's own words (which name the protocol and the address) stay in the log.
        message = body["error"]["message"]
        assert message == UNDECODABLE and "127.0.0.1" not in message and "rtp" not in message
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.recv(2048)  # nothing was sent to it
