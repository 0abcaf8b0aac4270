"""Benchmark: a conversation's KV cache carried across a swap (issue 61).

`make run`'s chat model (SmolLM2-135M-Instruct, Q4_1 GGUF) on llama.cpp, on demand, beside a
second on-demand model (the simulated engine) on a memory budget that holds one of them: a
request for the second makes room by stopping the first. For each history length, one
conversation through the gateway (a `modelship_site.server` process, as `make run` serves):

1. its first turn (the whole history computed);
2. a request for the other model: SmolLM2's engine is stopped to make room (its slot saved
   where caches are kept);
3. a short request of another conversation starts SmolLM2 again (so that what follows times
   the prompt, not the engine's start);
4. the conversation's next turn: with caches kept, its slot is restored before it is sent;
   without (MSHIP_KV_KEEP_BYTES=0, the baseline, in the same process tree), the whole history
   is computed again.

Figures per length: the next turn's time to first token with and without the restore and
their ratio (the goal: at most 1/10), the prompt tokens each computed (usage's prompt tokens
less its cached ones), the bytes saved on disk, the save's own time (as the stop logged it)
and what the swap's request took with and without saving (the stop's cost).

    .venv/bin/python bench/kv_resume.py [--tokens 2000,4000,6000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gateway import wait_up  # noqa: E402
from start_to_ready import setup_django  # noqa: E402

SAVED = re.compile(r"smol: saved \d+ slot cache\(s\) in ([0-9.]+) s")
WORDS = ("ledger", "invoice", "date", "amount", "customer", "clerk", "checked", "paid", "due")


def history(tokens: int) -> str:
    """About `tokens` tokens of a ledger's lines (SmolLM2's tokenizer: about 1.3 per word)."""
    lines, words = [], 0
    while words * 1.3 < tokens:
        n = len(lines)
        lines.append(f"Line {n}: " + " ".join(WORDS[(n + i) % len(WORDS)] for i in range(12)))
        words += 14
    return "\n".join(lines)


def turn(
    client: httpx.Client, base: str, model: str, messages: list[dict[str, str]]
) -> dict[str, Any]:
    """One streamed request: its TTFT, prompt tokens computed, reply and cache header."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    began = time.perf_counter()
    first, reply, usage = None, [], {}
    with client.stream("POST", base + "/v1/chat/completions", json=body) as answer:
        assert answer.status_code == 200, answer.read()
        cache = answer.headers.get("x-modelship-cache", "-")
        for line in answer.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    first = first or time.perf_counter() - began
                    reply.append(choice["delta"]["content"])
            usage = chunk.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "ttft": first or time.perf_counter() - began,
        "took": time.perf_counter() - began,
        "computed": usage.get("prompt_tokens", 0) - cached,
        "reply": "".join(reply),
        "cache": cache,
    }


def one_length(base: str, key: str, tokens: int) -> dict[str, Any]:
    from deployments import kv_store  # noqa: PLC0415 - after setup_django()

    system = "You keep the ledger below and answer questions about it briefly.\n" + history(tokens)
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": "How many lines are there?"},
    ]
    with httpx.Client(timeout=1200, headers={"authorization": f"Bearer {key}"}) as client:
        first = turn(client, base, "smol", messages)
        swap = turn(client, base, "other", [{"role": "user", "content": "hi"}])
        saved = kv_store.held("smol")
        turn(client, base, "smol", [{"role": "user", "content": "Hello."}])  # its start
        messages += [
            {"role": "assistant", "content": first["reply"]},
            {"role": "user", "content": "And the amount on line 3?"},
        ]
        after = turn(client, base, "smol", messages)
        turn(client, base, "other", [{"role": "user", "content": "hi"}])  # smol out again
    return {"first": first, "swap": swap, "after": after, "saved": saved}


def run(keep: bool, args: argparse.Namespace, key: str, env: dict[str, str]) -> dict[int, Any]:
    from deployments.runtimes.process import free_port  # noqa: PLC0415 - after setup_django()

    port = free_port("127.0.0.1")
    log = Path(env["MSHIP_VAR_DIR"]) / f"server-{keep}.log"
    metrics = Path(env["MSHIP_VAR_DIR"]) / f"metrics-{keep}"
    metrics.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "modelship_site.server", "--port", str(port)],
        cwd=REPO,
        env={
            **env,
            "MSHIP_KV_KEEP_BYTES": str(8 << 30 if keep else 0),
            "PROMETHEUS_MULTIPROC_DIR": str(metrics),
        },
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    rows: dict[int, Any] = {}
    try:
        wait_up(base + "/health", proc=server)
        for tokens in args.tokens:
            rows[tokens] = one_length(base, key, tokens)
            print(keep, tokens, rows[tokens], file=sys.stderr)
    finally:
        server.terminate()
        server.wait()
    saves = [float(t) for t in SAVED.findall(log.read_text(errors="replace"))]
    for n, tokens in enumerate(args.tokens):  # the first save of each length's two swaps
        rows[tokens]["save_s"] = saves[2 * n] if keep and len(saves) > 2 * n else None
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="2000,4000,6000", help="history lengths")
    args = parser.parse_args()
    args.tokens = [int(t) for t in args.tokens.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        setup_django(workdir)
        from django.core.management import call_command  # noqa: PLC0415 - after setup_django()

        from deployments import deployer, kv_store  # noqa: PLC0415 - after setup_django()
        from deployments.example_models import CATALOG  # noqa: PLC0415 - after setup_django()
        from deployments.models import Deployment  # noqa: PLC0415 - after setup_django()
        from openai_api.models import ApiKey  # noqa: PLC0415 - after setup_django()

        models = REPO / "var" / "models"
        call_command("fetch_example_model", "smollm2", "--into", str(models), stdout=io.StringIO())
        longest = max(args.tokens)
        smol = Deployment.objects.create(
            name="smol",
            model=str(models / CATALOG["smollm2"].filename),
            loader="llama_server",
            mode="on_demand",
            memory_gib=0.6,
            config={"n_ctx": max(2048, longest + 1024), "parallel": 1, "threads": 2},
        )
        other = Deployment.objects.create(
            name="other", model="simulated", loader="simulated", mode="on_demand", memory_gib=0.6
        )
        _, key = ApiKey.issue("bench", requests_per_minute=10**9)
        env = {
            **os.environ,
            "MSHIP_IN_CONTAINER": "0",
            "MSHIP_ROUTE_REFRESH_S": "0.2",
            "MSHIP_ACCESS_LOG": "off",
            "MSHIP_MEMORY_CAPACITY_GIB": "1.0",
            "MSHIP_CACHE_FIGURES": "all",  # the cached tokens reach the bench
            "MSHIP_KV_KEEP_MIN_TOKENS": "64",
        }

        def settle() -> None:
            """Both models stopped and nothing saved: each run begins alike (a gateway
            that starts anew does not know the last one's idle engines are idle)."""
            for row in (smol, other):
                deployer.stop(row.pk)
            kv_store.purge("smol")

        try:
            kept = run(True, args, key, env)
            settle()
            cold = run(False, args, key, env)
        finally:
            settle()
    report(kept, cold)


def report(kept: dict[int, Any], cold: dict[int, Any]) -> None:
    print("SmolLM2-135M on llama.cpp (2 threads), swapped out by another on-demand model")
    print()
    print(
        "| history (tokens) | next turn's TTFT, restored (s) | cold re-prefill (s) | ratio"
        " | tokens computed: restored / cold | saved on disk (MiB) | save (s)"
        " | swap request: saving / not (s) | same reply |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for tokens, row in kept.items():
        base = cold[tokens]
        after, again = row["after"], base["after"]
        save = f"{row['save_s']:.3f}" if row.get("save_s") is not None else "-"
        print(
            f"| {tokens:,} | {after['ttft']:.3f} | {again['ttft']:.3f}"
            f" | {after['ttft'] / again['ttft']:.3f}"
            f" | {after['computed']:,} / {again['computed']:,}"
            f" | {row['saved'][1] / 2**20:.1f} | {save}"
            f" | {row['swap']['took']:.2f} / {base['swap']['took']:.2f}"
            f" | {'yes' if after['reply'] == again['reply'] else 'no'} ({after['cache']}) |"
        )


if __name__ == "__main__":
    main()
