"""Speech out in OpenAI's formats, streamed as it is synthesised: wav and pcm as they are,
mp3, opus (in Ogg), aac (ADTS) and flac through ffmpeg (Debian's ``ffmpeg``), which gets
nothing but PCM on its stdin.

A streamed WAV cannot know its length up front: its header carries the sizes streaming
writers use for "unknown" (0xFFFFFFFF), which players and decoders read to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

CONTENT_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}
FFMPEG_OUTPUT = {
    "mp3": ["-c:a", "libmp3lame", "-b:a", "64k", "-f", "mp3"],
    "opus": ["-c:a", "libopus", "-b:a", "32k", "-f", "ogg"],
    "aac": ["-c:a", "aac", "-b:a", "64k", "-f", "adts"],
    "flac": ["-c:a", "flac", "-f", "flac"],
}
UNKNOWN_SIZE = 0xFFFFFFFF


def formats() -> list[str]:
    """The formats this host can answer: the encoded ones only where ffmpeg is installed."""
    native = ["wav", "pcm"]
    return [*FFMPEG_OUTPUT, *native] if shutil.which("ffmpeg") else native


def default_format() -> str:
    """OpenAI's default (mp3) where it can be made, else wav."""
    return "mp3" if "mp3" in formats() else "wav"


def wav_header(rate: int) -> bytes:
    """A 16-bit mono WAV header of unknown length."""
    return (
        b"RIFF"
        + struct.pack("<I", UNKNOWN_SIZE)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", UNKNOWN_SIZE)
    )


async def encoded(fmt: str, rate: int, pcm: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The PCM chunks in `fmt`, each piece as soon as it is made."""
    if fmt == "pcm":
        async for chunk in pcm:
            yield chunk
        return
    if fmt == "wav":
        yield wav_header(rate)
        async for chunk in pcm:
            yield chunk
        return
    async for piece in through_ffmpeg(fmt, rate, pcm):
        yield piece


async def through_ffmpeg(fmt: str, rate: int, pcm: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    process = await asyncio.create_subprocess_exec(
        "ffmpeg",
        *("-hide_banner", "-loglevel", "error", "-nostdin"),
        # Raw samples in, the encoded audio out: pipes only, as for decoding (whisper_server).
        *("-protocol_whitelist", "pipe"),
        *("-f", "s16le", "-ar", str(rate), "-ac", "1", "-i", "pipe:0"),
        *FFMPEG_OUTPUT[fmt],
        "pipe:1",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout

    async def feed() -> None:
        try:
            async for chunk in pcm:
                stdin.write(chunk)
                await stdin.drain()
        finally:
            stdin.close()

    feeding = asyncio.create_task(feed())
    try:
        while piece := await stdout.read(16384):
            yield piece
        await feeding  # the synthesis's own failure, if it had one
        if await process.wait() != 0:
            assert process.stderr is not None
            words = (await process.stderr.read()).decode(errors="replace").strip()
            raise ValueError(f"ffmpeg could not encode {fmt}: {words}")
    finally:
        feeding.cancel()
        if process.returncode is None:  # the client went away: no more encoding
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
