"""modelship ps | logs | start | stop | sleep | wake | deploy | keys | run.

Talks to a running Modelship through its REST API (and /v1 for `run`): MSHIP_URL (default
http://127.0.0.1:8000), MSHIP_TOKEN (else var/admin_token, which `make run` writes) and
MSHIP_API_KEY for `run` (else var/api_key). Exit codes: 0 done, 1 refused or failed,
2 not found, 3 Modelship unreachable or the token not allowed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from modelship_cli import render
from modelship_cli.client import NOT_FOUND, OK, REFUSED, Api, CliError, Config

SETTLED = {"ready", "failed", "stopped", "planned", "asleep"}
POLL_S = 0.5

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def ps(api: Api, args: argparse.Namespace) -> int:
    rows = sorted(api.pages("/api/deployments/"), key=lambda r: r["name"])
    if args.json:
        print(json.dumps([dict(zip(render.COLUMNS, render.ps_row(r), strict=True)) for r in rows]))
    else:
        out.print(render.ps_table(rows))
    return OK


def logs(api: Api, args: argparse.Namespace) -> int:
    row = api.deployment(args.name)
    path = f"/api/deployments/{row['id']}/logs/"
    if not args.follow:
        answer = api.get(path, tail=args.tail)
        for replica in answer["replicas"]:
            if len(answer["replicas"]) > 1:
                out.print(f"[bold]replica {replica['replica']}[/bold]")
            for line in replica["lines"]:
                print(line)
        return OK
    event = ""
    for line in api.stream("GET", path, params={"follow": "true", "replica": args.replica}):
        if line.startswith(":"):  # the stream is open
            err.print(f"[dim](following {row['name']}, replica {args.replica})[/dim]")
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            text = line[5:].removeprefix(" ")
            if event == "end":
                err.print(f"[dim]({text})[/dim]")
                return OK
            print(text, flush=True)
    return OK


def operate(api: Api, args: argparse.Namespace) -> int:
    row = api.deployment(args.name)
    answer = api.post(f"/api/deployments/{row['id']}/{args.command}/")
    out.print(f"{row['name']}: {args.command} {answer['status']}")
    if args.wait and answer["status"] == "queued":
        return wait_for(api, {row["name"]: row["id"]})
    return OK


def deploy(api: Api, args: argparse.Namespace) -> int:
    try:
        text = Path(args.file).read_text()
    except OSError as exc:
        raise CliError(f"{args.file}: {exc.strerror}", NOT_FOUND) from exc
    body = {"file": text, "reconcile": args.reconcile}
    try:
        answer = api.post("/api/apply", body)
    except CliError as exc:
        raise CliError(f"{args.file}: {exc}", exc.code) from exc
    for label in ("created", "updated", "unchanged", "removed"):
        if answer[label]:
            out.print(f"{label}: {', '.join(answer[label])}")
    if not args.wait:
        return OK
    touched = set(answer["created"]) | set(answer["updated"])
    return wait_for(api, {n: i for n, i in answer["ids"].items() if n in touched})


def wait_for(api: Api, ids: dict[str, int]) -> int:
    """Until each deployment settles (ready, failed, …), its state and progress (an image
    pull, an environment's install) shown live; 1 when one failed."""
    if not ids:
        return OK
    time.sleep(POLL_S)  # the queued work takes the row first
    with Live(console=out, refresh_per_second=4, transient=not out.is_terminal) as live:
        while True:
            rows = [api.get(f"/api/deployments/{pk}/") for pk in ids.values()]
            live.update(render.progress_table(rows))
            if all(r["state"] in SETTLED for r in rows):
                break
            time.sleep(POLL_S)
    failed = [r for r in rows if r["state"] == "failed"]
    for row in rows:
        reason = f" ({row['state_reason']})" if row["state_reason"] else ""
        out.print(f"{row['name']}: {row['state']}{reason}")
    return REFUSED if failed else OK


def keys(api: Api, args: argparse.Namespace) -> int:
    if args.action == "create":
        body: dict[str, Any] = {"name": args.name}
        if args.models:
            body["allowed_models"] = [m.strip() for m in args.models.split(",") if m.strip()]
        if args.rpm is not None:
            body["requests_per_minute"] = args.rpm
        made = api.post("/api/keys/", body)
        err.print(f"[dim]{made['name']} ({made['prefix']}-…), shown once:[/dim]")
        print(made["key"])
    elif args.action == "list":
        rows = list(api.pages("/api/keys/"))
        for row in rows:
            models = ",".join(row["allowed_models"]) or "all"
            state = "revoked" if row["revoked"] else "active"
            print(f"{row['id']}\t{row['prefix']}\t{row['name']}\t{state}\t{models}")
    else:
        key = find_key(api, args.name)
        api.post(f"/api/keys/{key['id']}/revoke/")
        out.print(f"revoked {key['name']} ({key['prefix']}-…)")
    return OK


def find_key(api: Api, wanted: str) -> dict[str, Any]:
    for row in api.pages("/api/keys/"):
        if wanted in (str(row["id"]), row["name"], row["prefix"]):
            return row
    raise CliError(f"no key {wanted!r} (give its id, name or msk- prefix)", NOT_FOUND)


def run(api: Api, args: argparse.Namespace) -> int:
    """Stream a chat answer, like `ollama run`: the prompt from the argument, else stdin."""
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    headers = {"authorization": f"Bearer {api.config.api_key}"} if api.config.api_key else {}
    body = {
        "model": args.name,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
    }
    if args.max_tokens:
        body["max_tokens"] = args.max_tokens
    for line in api.stream("POST", "/v1/chat/completions", json=body, headers=headers):
        if not line.startswith("data:"):
            continue  # keepalives while an on-demand model starts
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            print()
            raise CliError(str(chunk["error"].get("message")), REFUSED)
        for choice in chunk.get("choices") or []:
            print((choice.get("delta") or {}).get("content") or "", end="", flush=True)
    print()
    return OK


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="modelship", description=__doc__.split("\n\n")[1])
    sub = top.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("ps", help="deployments, their state, GPUs, load and idle time")
    listing.add_argument("--json", action="store_true", help="one JSON list, for scripts")
    listing.set_defaults(handler=ps)
    tail = sub.add_parser("logs", help="an engine's log")
    tail.add_argument("name")
    tail.add_argument("-f", "--follow", action="store_true", help="follow new lines")
    tail.add_argument("-n", "--tail", type=int, default=100)
    tail.add_argument("--replica", type=int, default=0)
    tail.set_defaults(handler=logs)
    for action in ("start", "stop", "sleep", "wake"):
        each = sub.add_parser(action, help=f"{action} a deployment")
        each.add_argument("name")
        each.add_argument("--wait", action="store_true", help="until it settles")
        each.set_defaults(handler=operate)
    apply = sub.add_parser("deploy", help="apply a models.yaml")
    apply.add_argument("-f", "--file", required=True)
    apply.add_argument("--reconcile", action="store_true", help="remove what it does not name")
    apply.add_argument("--wait", action="store_true", help="until each is ready or failed")
    apply.set_defaults(handler=deploy)
    key = sub.add_parser("keys", help="API keys of /v1")
    key_sub = key.add_subparsers(dest="action", required=True)
    create = key_sub.add_parser("create")
    create.add_argument("name")
    create.add_argument("--models", help="comma-separated names it may call (default: all)")
    create.add_argument("--rpm", type=int, help="requests per minute")
    key_sub.add_parser("list")
    revoke = key_sub.add_parser("revoke")
    revoke.add_argument("name", help="the key's id, name or msk- prefix")
    key.set_defaults(handler=keys)
    talk = sub.add_parser("run", help="stream a chat answer from a model")
    talk.add_argument("name")
    talk.add_argument("prompt", nargs="?")
    talk.add_argument("--max-tokens", type=int)
    talk.set_defaults(handler=run)
    return top


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = args.handler(Api(Config.from_env()), args)
    except CliError as exc:
        err.print(f"modelship: {exc}", markup=False)
        code = exc.code
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
