"""Benchmark: what cache-aware routing saves a real engine's prefix cache.

Three replicas of `make run`'s chat model (SmolLM2-135M-Instruct, Q4_1 GGUF) on llama.cpp's
server, which keeps each slot's KV cache and reuses the longest matching prefix of a new
prompt. A workload of conversations of several turns, each tenant's under a long system
prompt of its own, sent concurrently through the gateway under each routing policy
(MSHIP_ROUTING_POLICY): fewest outstanding (the baseline), round robin, and cache-aware. The
conversations begin `--stagger` seconds apart and a user thinks `--think` seconds between
turns (all at once, every first turn computes its system prompt in a slot of its own before
any is cached, whatever the policy). Before each policy the replicas start again (no cache
carried over) and a gateway process starts with that policy (no affinity carried over).
Each request's replica, turn, prompt tokens computed (usage's prompt tokens less its cached
ones) and TTFT go to stderr, for a closer look.

A policy named with `:no-copy` (`least-outstanding:no-copy`) runs with no slot's cache copied
into another's (MSHIP_SLOT_COPY_MIN_BLOCKS=0): each slot computes a shared prompt itself, as
llama.cpp does on its own.

Figures per policy: the prompt tokens the engines computed (llama.cpp's
`llamacpp:prompt_tokens_total`, summed over the replicas: cached tokens are not in it), time
to first token p50/p99, requests per second, and the requests each replica took against the
mean. Ratios are against fewest outstanding, run in the same process tree.

    .venv/bin/python bench/prefix_routing.py [--tenants 3] [--conversations 12] [--turns 4]
        [--system-words 600] [--policies least-outstanding,round-robin,cache-aware]
        (a policy may be given as least-outstanding:no-copy)
        [--replicas 3] [--workers 4]

`--workers N` serves through `serve --workers N --gateway-only`: N gateway processes whose
replica and slot choices are the site scheduler's (one table for all of them).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from gateway import route_table_read, wait_up  # noqa: E402
from start_to_ready import setup_django  # noqa: E402

TOPICS = ("the bakery's ledger", "a cycling club's calendar", "a clinic's rota")
QUESTIONS = (
    "What is the first thing I should check?",
    "And after that?",
    "How long does that usually take?",
    "Summarise what we said in one line.",
    "Anything else?",
    "Thanks, one last check?",
)
PROMPT_TOKENS = re.compile(r"^llamacpp:prompt_tokens_total\s+(\S+)", re.MULTILINE)


def system_prompt(tenant: int, words: int) -> str:
    """A tenant's long system prompt: its own opening, then rules numbered to `words`."""
    topic = TOPICS[tenant % len(TOPICS)]
    text = [f"You are the assistant of tenant {tenant}, who keeps {topic}."]
    rule = 0
    while sum(len(t.split()) for t in text) < words:
        rule += 1
        text.append(f"Rule {rule}: answer plainly about {topic}, and keep figures exact.")
    return " ".join(text)


def computed(urls: list[str], auth: httpx.Auth) -> float:
    """Prompt tokens the engines have computed so far (their prefix cache's hits excluded);
    `auth`: their secrets (llama.cpp's /metrics asks for them)."""
    total = 0.0
    for url in urls:
        found = PROMPT_TOKENS.search(httpx.get(url + "/metrics", timeout=10, auth=auth).text)
        total += float(found.group(1)) if found else 0.0
    return total


def converse(
    base: str,
    key: str,
    system: str,
    who: int,
    args: argparse.Namespace,
    out: list[dict[str, Any]],
) -> None:
    time.sleep(who * args.stagger)  # conversations begin one after another, as users do
    messages: list[dict[str, str]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"I am user {who}. {QUESTIONS[0]}"},
    ]
    with httpx.Client(timeout=600, headers={"authorization": f"Bearer {key}"}) as client:
        for turn in range(args.turns):
            if turn:
                time.sleep(args.think)  # the user reads the answer and types the next
            began = time.perf_counter()
            first = None
            reply: list[str] = []
            body = {
                "model": "smol",
                "messages": messages,
                "max_tokens": 8,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            with client.stream("POST", base + "/v1/chat/completions", json=body) as answer:
                assert answer.status_code == 200, answer.read()
                replica = answer.headers.get("x-modelship-replica", "?")
                cache = answer.headers.get("x-modelship-cache", "?")
                cached = prompt = 0
                for line in answer.iter_lines():
                    if line.startswith("data: {") and '"content"' in line:
                        first = first or time.perf_counter() - began
                        reply.append(line)
                    elif line.startswith("data: {") and '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage") or {}
                        prompt = usage.get("prompt_tokens", 0)
                        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            ttft = first or time.perf_counter() - began
            out.append(
                {
                    "ttft": ttft,
                    "replica": replica,
                    "turn": turn,
                    "who": who,
                    "new": prompt - cached,
                    "cache": cache,
                }
            )
            said = f"(answer {turn})"
            messages += [
                {"role": "assistant", "content": said},
                {"role": "user", "content": QUESTIONS[(turn + 1) % len(QUESTIONS)]},
            ]


def run_policy(
    policy: str, args: argparse.Namespace, pk: int, key: str, env: dict[str, str]
) -> dict[str, Any]:
    from deployments import deployer, engine_secrets  # noqa: PLC0415 - after setup_django()
    from deployments.models import Deployment  # noqa: PLC0415 - after setup_django()
    from deployments.runtimes.process import free_port  # noqa: PLC0415 - after setup_django()

    deployer.stop(pk)  # new engine processes: no cache carried over from the last policy
    port = free_port("127.0.0.1")
    # The gateway starts while the replicas do (its imports take seconds), and is asked once
    # its route table has them ready: on /metrics, where the last policy's gateway, gone
    # without marking itself dead, would still count (its own metrics folder each).
    name, _, variant = policy.partition(":")
    metrics = Path(env["MSHIP_VAR_DIR"]) / f"metrics-{name}-{variant}"
    metrics.mkdir()
    command = [sys.executable, "-m", "modelship_site.server", "--port", str(port)]
    env = {**env, "MSHIP_ROUTING_POLICY": name, "PROMETHEUS_MULTIPROC_DIR": str(metrics)}
    if variant == "no-copy":  # each slot computes its own prefix (llama.cpp's own way)
        env["MSHIP_SLOT_COPY_MIN_BLOCKS"] = "0"
    elif variant:
        raise SystemExit(f"{policy}: the one variant is :no-copy")
    owner = None
    if args.workers > 1:
        # Gateway processes on one socket whose replica and slot choices are the site's one
        # scheduler's, as `serve --workers N` runs them (its owner, here apart: `serve` would
        # also stop and resume the bench's engines).
        env["MSHIP_SCHEDULER_URL"] = f"unix:{tempfile.mkdtemp(prefix='ms-')}/scheduler.sock"
        scheduler = [sys.executable, "manage.py", "scheduler", "--fresh"]
        owner = subprocess.Popen(scheduler, cwd=REPO, env=env)
        serve = [sys.executable, "manage.py", "serve", "--port", str(port), "--gateway-only"]
        command = [*serve, "--workers", str(args.workers)]
    server = subprocess.Popen(command, cwd=REPO, env=env)
    try:
        deployer.restart(pk)
        ready = time.time()
        row = Deployment.objects.get(pk=pk)
        urls, auth = list(row.engine_urls), engine_secrets.auth(row)
        base = f"http://127.0.0.1:{port}"
        wait_up(base + "/health", proc=server)
        route_table_read(base, ready)
        before = computed(urls, auth)
        results: list[dict[str, Any]] = []
        systems = [system_prompt(t, args.system_words) for t in range(args.tenants)]
        threads = [
            threading.Thread(
                target=converse,
                args=(base, key, systems[c % args.tenants], c, args, results),
            )
            for c in range(args.conversations)
        ]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
        after = computed(urls, auth)
    finally:
        server.terminate()
        server.wait()
        if owner is not None:
            owner.terminate()
            owner.wait()
    if len(results) != args.conversations * args.turns:
        raise SystemExit(f"{policy}: {len(results)} answers of {args.conversations * args.turns}")
    print(
        policy,
        sorted(
            (r["who"], r["turn"], r["replica"], r["cache"], r["new"], round(r["ttft"], 2))
            for r in results
        ),
        file=sys.stderr,
    )
    ttfts = sorted(r["ttft"] for r in results)
    spread = Counter(r["replica"] for r in results)
    mean = len(results) / len(urls)
    return {
        "computed": after - before,
        "p50": statistics.median(ttfts),
        "p99": ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))],
        "rps": len(results) / elapsed,
        "spread": [spread.get(str(i), 0) for i in range(len(urls))],
        "max_over_mean": max(spread.values()) / mean,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=600)
    parser.add_argument("--stagger", type=float, default=3.0, help="s between conversations")
    parser.add_argument("--think", type=float, default=1.0, help="s between a conversation's turns")
    parser.add_argument("--policies", default="least-outstanding,round-robin,cache-aware")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1, help="gateway processes (serve)")
    args = parser.parse_args()
    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        setup_django(workdir)
        from django.core.management import call_command  # noqa: PLC0415 - after setup_django()

        from deployments import deployer  # noqa: PLC0415 - after setup_django()
        from deployments.example_models import CATALOG  # noqa: PLC0415 - after setup_django()
        from deployments.models import Deployment  # noqa: PLC0415 - after setup_django()
        from openai_api.models import ApiKey  # noqa: PLC0415 - after setup_django()

        models = REPO / "var" / "models"
        fetched = io.StringIO()  # what it says is not a figure
        call_command("fetch_example_model", "smollm2", "--into", str(models), stdout=fetched)
        # Each replica: one thread (three replicas share two cores), four slots of 2,048
        # tokens each (a system prompt and four turns fit a slot).
        config = {"n_ctx": 8192, "parallel": 4, "threads": 1}
        deployment = Deployment.objects.create(
            name="smol",
            model=str(models / CATALOG["smollm2"].filename),
            loader="llama_server",
            num_replicas=args.replicas,
            memory_gib=0.5,
            config=config,
        )
        _, key = ApiKey.issue("bench", requests_per_minute=10**9)
        env = {**os.environ, "MSHIP_IN_CONTAINER": "0", "MSHIP_ROUTE_REFRESH_S": "0.2"}
        env["MSHIP_ACCESS_LOG"] = "off"
        rows: dict[str, dict[str, Any]] = {}
        try:
            for policy in policies:
                rows[policy] = run_policy(policy, args, deployment.pk, key, env)
                print(policy, rows[policy], file=sys.stderr)
        finally:
            deployer.stop(deployment.pk)
    report(rows, args)


def report(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    base = rows.get("least-outstanding") or next(iter(rows.values()))
    print(
        f"{args.tenants} tenants, {args.conversations} conversations x {args.turns} turns,"
        f" system prompts of {args.system_words} words; {args.replicas} llama.cpp replicas of"
        f" SmolLM2-135M; {args.workers} gateway process(es)"
    )
    print()
    print(
        "| policy | prompt tokens computed | ratio | TTFT p50 (s) | ratio | TTFT p99 (s)"
        " | requests/s | ratio | requests per replica | max / mean |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for policy, row in rows.items():
        print(
            f"| {policy} | {row['computed']:,.0f} | {row['computed'] / base['computed']:.2f}"
            f" | {row['p50']:.2f} | {row['p50'] / base['p50']:.2f} | {row['p99']:.2f}"
            f" | {row['rps']:.2f} | {row['rps'] / base['rps']:.2f}"
            f" | {'/'.join(map(str, row['spread']))} | {row['max_over_mean']:.2f} |"
        )


if __name__ == "__main__":
    main()
