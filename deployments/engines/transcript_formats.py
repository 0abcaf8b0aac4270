"""A transcript in OpenAI's response formats: json, text, srt, vtt and verbose_json (the
segments with their times, the language by name, the duration), as the SDK parses them."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
# OpenAI's verbose_json names the language in full; the languages people ask for most.
LANGUAGE_NAMES = {
    "en": "english",
    "de": "german",
    "fr": "french",
    "es": "spanish",
    "it": "italian",
    "pt": "portuguese",
    "nl": "dutch",
    "ru": "russian",
    "zh": "chinese",
    "ja": "japanese",
    "ko": "korean",
    "ar": "arabic",
    "hi": "hindi",
    "pl": "polish",
    "tr": "turkish",
    "uk": "ukrainian",
    "sv": "swedish",
}


@dataclass(frozen=True)
class Segment:
    start: float  # seconds
    end: float
    text: str


def render(
    fmt: str, task: str, language: str, duration: float, segments: list[Segment]
) -> tuple[str, str]:
    """The body and its content type."""
    text = " ".join(s.text.strip() for s in segments).strip()
    usage = {"type": "duration", "seconds": math.ceil(duration)}
    if fmt == "text":
        return text + "\n", "text/plain"
    if fmt == "srt":
        return subtitles(segments, ",", numbered=True), "application/x-subrip"
    if fmt == "vtt":
        return "WEBVTT\n\n" + subtitles(segments, ".", numbered=False), "text/vtt"
    if fmt == "verbose_json":
        body = {
            "task": task,
            "language": LANGUAGE_NAMES.get(language, language),
            "duration": round(duration, 3),
            "text": text,
            "segments": [
                {
                    "id": i,
                    "seek": 0,
                    "start": round(s.start, 2),
                    "end": round(s.end, 2),
                    "text": s.text,
                    "tokens": [],
                    "temperature": 0.0,
                    "avg_logprob": 0.0,
                    "compression_ratio": 1.0,
                    "no_speech_prob": 0.0,
                }
                for i, s in enumerate(segments)
            ],
            "usage": usage,
        }
        return json.dumps(body), "application/json"
    return json.dumps({"text": text, "usage": usage}), "application/json"


def subtitles(segments: list[Segment], decimal: str, numbered: bool) -> str:
    blocks = []
    for i, segment in enumerate(segments, 1):
        times = f"{stamp(segment.start, decimal)} --> {stamp(segment.end, decimal)}"
        lines = [str(i)] if numbered else []
        blocks.append("\n".join([*lines, times, segment.text.strip()]))
    return "\n\n".join(blocks) + "\n"


def stamp(seconds: float, decimal: str) -> str:
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal}{millis:03d}"
