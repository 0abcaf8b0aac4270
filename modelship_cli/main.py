"""modelship ps | logs | describe | events | start | stop | sleep | wake | deploy | keys | run |
usage | teams | pull | models | login.

Talks to a running Modelship through its REST API (and /v1 for `run`). The site, its /api
token and a /v1 key come from MODELSHIP_URL, MODELSHIP_TOKEN and MODELSHIP_API_KEY (or their
MSHIP_ names), else the file `modelship login` saves, else ./var (where `make run` keeps
them) when run in the site's folder. A token or key about to go over plain http to another
host is warned of (MODELSHIP_INSECURE_OK=1: not). Exit codes: 0 done, 1 refused or failed,
2 not found, 3 Modelship unreachable or the token not allowed.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live

from modelship_cli import render, store, usage
from modelship_cli.client import (
    DEFAULT_URL,
    NOT_FOUND,
    OK,
    REFUSED,
    Api,
    CliError,
    Config,
    write_saved,
)

SETTLED = {"ready", "failed", "stopped", "planned", "asleep"}
POLL_S = 0.5
EVENTS_POLL_S = 1.0
QUEUED_GRACE_S = 30.0  # for the task queue to take up the work (a busy host's cluster)

out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # a message as one line


def ps(api: Api, args: argparse.Namespace) -> int:
    rows = sorted(api.pages("/api/deployments/"), key=lambda r: r["name"])
    if args.running:
        rows = [r for r in rows if r["state"] in render.RUNNING]
    elif not args.all:
        rows = [r for r in rows if r["state"] not in render.QUIET]
    if args.json:
        print(json.dumps([render.record(r) for r in rows]))
        return OK
    out.print(render.ps_table(rows))
    for line in render.failures(rows):
        out.print(line, markup=False, highlight=False)
    out.print(render.host_line(api.get("/api/host")), markup=False)
    return OK


def logs(api: Api, args: argparse.Namespace) -> int:
    row = api.deployment(args.name)
    path = f"/api/deployments/{row['id']}/logs/"
    if not args.follow:
        print_tail(api, path, args.tail)
        return OK
    event = ""
    for line in api.stream("GET", path, params={"follow": "true", "replica": args.replica}):
        if line.startswith(":"):  # the stream is open: what came before it, then what comes
            print_tail(api, path, args.tail, only=args.replica)
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


def print_tail(api: Api, path: str, lines: int, only: int | None = None) -> None:
    """The last lines of each replica's log (of one, `only`), each under its name where
    there are several."""
    replicas = api.get(path, tail=lines)["replicas"]
    if only is not None:
        replicas = [r for r in replicas if r["replica"] == only]
    for replica in replicas:
        if len(replicas) > 1:
            out.print(f"[bold]replica {replica['replica']}[/bold]")
        for line in replica["lines"]:
            print(line)


def operate(api: Api, args: argparse.Namespace) -> int:
    row = api.deployment(args.name)
    answer = api.post(f"/api/deployments/{row['id']}/{args.command}/")
    out.print(f"{row['name']}: {args.command} {answer['status']}")
    if args.wait and answer["status"] == "queued":
        return wait_for(api, {row["name"]: row["id"]}, {row["id"]: row["state"]})
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
    ids = {n: i for n, i in answer["ids"].items() if n in touched}
    # An always-on one has a start queued: it is not done while it is still as it was.
    rows = [api.get(f"/api/deployments/{pk}/") for pk in ids.values()]
    before = {r["id"]: r["state"] for r in rows if r.get("effective_mode") == "always_on"}
    return wait_for(api, ids, before)


def wait_for(api: Api, ids: dict[str, int], before: dict[int, str]) -> int:
    """Until each deployment settles (ready, failed, …), its state and progress (an image
    pull, an environment's install) shown live; 1 when one failed. One whose queued work
    has not taken it yet (still in its state `before`) is waited for up to QUEUED_GRACE_S:
    a start refused for memory leaves it as it was."""
    if not ids:
        return OK
    grace_until = time.monotonic() + QUEUED_GRACE_S

    def settled(row: dict[str, Any]) -> bool:
        untouched = before.get(row["id"]) == row["state"] and time.monotonic() < grace_until
        return row["state"] in SETTLED and not untouched

    with Live(console=out, refresh_per_second=4, transient=not out.is_terminal) as live:
        while True:
            rows = [api.get(f"/api/deployments/{pk}/") for pk in ids.values()]
            live.update(render.progress_table(rows))
            if all(settled(r) for r in rows):
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
        if args.priority is not None:
            body["priority"] = args.priority
        if args.max_concurrency is not None:
            body["max_concurrency"] = args.max_concurrency
        if args.team is not None:
            body["team"] = args.team
        body.update(usage.budget_body(args))
        made = api.post("/api/keys/", body)
        err.print(f"[dim]{made['name']} ({made['prefix']}-…), shown once:[/dim]")
        print(made["key"])
    elif args.action == "list":
        # Tab-separated, a header first: a table to read and a script's `cut -f`.
        print("\t".join(("ID", "PREFIX", "NAME", "STATE", "MODELS", "RATE", "LAST USED")))
        for row in api.pages("/api/keys/"):
            models = ",".join(row["allowed_models"]) or "all"
            state = "revoked" if row["revoked"] else "active"
            limit = row.get("rate_per_minute")
            rate = f"{'no limit' if limit is None else f'{limit}/min'} ({row.get('rate_from')})"
            used = render.to_the_second(row.get("last_used")) or "never"
            fields = (row["id"], row["prefix"], row["name"], state, models, rate, used)
            print("\t".join(str(f) for f in fields))
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
    """Use a model as its use case has it, like `ollama run`: chat streams an answer,
    embeddings print the vector, speech and images are written to a file, transcription
    and translation read one. The prompt comes from the argument, else stdin."""
    usecase = usecase_of(api, args.name)
    if usecase in ("transcription", "translation"):
        return transcribe(api, args, usecase)
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if usecase == "embed":
        body = {"model": args.name, "input": prompt}
        answer = api.call("POST", "/v1/embeddings", json=body, headers=api.v1_headers())
        print(json.dumps(answer["data"][0]["embedding"]))
        return OK
    if usecase == "tts":
        target = Path(args.output or f"{args.name}.mp3")
        fmt = target.suffix.lstrip(".").lower() or "mp3"
        body = {"model": args.name, "input": prompt, "voice": args.voice, "response_format": fmt}
        answer = api.send("POST", "/v1/audio/speech", json=body, headers=api.v1_headers())
        return written(target, answer.content)
    if usecase == "image":
        target = Path(args.output or f"{args.name}.png")
        body = {"model": args.name, "prompt": prompt, "response_format": "b64_json"}
        made = api.call("POST", "/v1/images/generations", json=body, headers=api.v1_headers())
        return written(target, base64.b64decode(made["data"][0]["b64_json"]))
    return chat(api, args, prompt)


def usecase_of(api: Api, name: str) -> str:
    """The deployment's use case, through /api; chat where only a /v1 key is at hand."""
    if not api.config.token:
        return "generate"
    return str(api.deployment(name).get("usecase") or "generate")


def written(target: Path, content: bytes) -> int:
    try:
        target.write_bytes(content)
    except OSError as exc:
        raise CliError(f"{target}: {exc.strerror}", REFUSED) from exc
    print(f"wrote {target} ({len(content):,} bytes)")
    return OK


def transcribe(api: Api, args: argparse.Namespace, usecase: str) -> int:
    if args.prompt is None:
        raise CliError(f"{args.name} takes an audio file: modelship run {args.name} FILE")
    audio = Path(args.prompt)
    try:
        data = audio.read_bytes()
    except OSError as exc:
        raise CliError(f"{audio}: {exc.strerror}", NOT_FOUND) from exc
    path = "/v1/audio/transcriptions" if usecase == "transcription" else "/v1/audio/translations"
    answer = api.call(
        "POST",
        path,
        data={"model": args.name},
        files={"file": (audio.name, data)},
        headers=api.v1_headers(),
    )
    print(answer["text"])
    return OK


def chat(api: Api, args: argparse.Namespace, prompt: str) -> int:
    body = {
        "model": args.name,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
    }
    if args.max_tokens:
        body["max_tokens"] = args.max_tokens
    for line in api.stream("POST", "/v1/chat/completions", json=body, headers=api.v1_headers()):
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


def describe(api: Api, args: argparse.Namespace) -> int:
    row = api.deployment(args.name)
    events = api.get("/api/events/", deployment=row["id"])["results"][: args.events]
    if args.json:
        print(json.dumps({**row, "events": events}))
        return OK
    for line in render.description(row, events):
        print(line)
    return OK


def events(api: Api, args: argparse.Namespace) -> int:
    """The latest events (of one deployment, or all), oldest first; -f then prints each new
    one as it is recorded (polled: the API keeps them, newest first)."""
    params: dict[str, Any] = {}
    if args.name:
        params["deployment"] = api.deployment(args.name)["id"]
    latest = api.get("/api/events/", **params)["results"][: args.tail]
    for event in reversed(latest):
        print(render.event_line(event), flush=True)
    if not args.follow:
        return OK
    seen = max((e["id"] for e in latest), default=0)
    while True:
        time.sleep(EVENTS_POLL_S)
        new = [e for e in api.get("/api/events/", **params)["results"] if e["id"] > seen]
        for event in sorted(new, key=lambda e: e["id"]):
            print(render.event_line(event), flush=True)
            seen = event["id"]


def login(_: Api, args: argparse.Namespace) -> int:
    """Save a site and its /api token for every later command, from any directory. The
    token from --token-file, else MODELSHIP_TOKEN (or MSHIP_TOKEN), else asked or read from
    stdin: never from the command line, which every user of the host sees (ps)."""
    if args.token is not None or args.api_key is not None:
        said, instead = (
            ("--token", "--token-file PATH or MODELSHIP_TOKEN, or give it when asked (or on stdin)")
            if args.token is not None
            else ("--api-key", "--api-key-file PATH or MODELSHIP_API_KEY")
        )
        raise CliError(
            f"{said} is refused: a secret on the command line is seen by every user of this "
            f"host (ps); use {instead}",
            REFUSED,
        )
    url = (args.url or Config.from_env().url).rstrip("/")
    named = os.environ.get("MODELSHIP_TOKEN") or os.environ.get("MSHIP_TOKEN")
    if args.token_file:
        token = read_secret(args.token_file, "token")
    elif named:
        token = named
    elif sys.stdin.isatty():
        token = getpass.getpass(f"/api token for {url}: ")
    else:
        token = sys.stdin.readline()
    token = token.strip()
    if not token:
        raise CliError("no token given (--token-file, MODELSHIP_TOKEN, or on stdin)", REFUSED)
    api_key = read_secret(args.api_key_file, "key") if args.api_key_file else ""
    config = Config(url=url, token=token, api_key=api_key)
    Api(config).get("/api/host")  # the site answers and takes the token
    values = {"url": url, "token": token}
    if api_key:
        values["api_key"] = api_key
    print(f"logged in to {url}; saved in {write_saved(values)}")
    return OK


def read_secret(path: str, what: str) -> str:
    try:
        return Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not text"
        raise CliError(f"cannot read the {what} file {path}: {reason}", NOT_FOUND) from exc


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="modelship", description=__doc__.split("\n\n")[1])
    sub = top.add_subparsers(dest="command", required=True)
    listing = sub.add_parser(
        "ps", help="deployments (not stopped or planned: -a for all), GPUs, load, idle time"
    )
    listing.add_argument("--json", action="store_true", help="one JSON list, for scripts")
    shown = listing.add_mutually_exclusive_group()
    shown.add_argument("-a", "--all", action="store_true", help="stopped and planned ones too")
    shown.add_argument("--running", action="store_true", help="only those whose engine runs")
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
    create.add_argument(
        "--priority", help="high, normal, low or a number from -100 to 100 (default: normal)"
    )
    create.add_argument(
        "--max-concurrency", type=int, help="most requests in flight at once (default: no limit)"
    )
    create.add_argument("--team", help="its team's name or id (default: none)")
    usage.add_budget_options(create)
    key_sub.add_parser("list")
    revoke = key_sub.add_parser("revoke")
    revoke.add_argument("name", help="the key's id, name or msk- prefix")
    key.set_defaults(handler=keys)
    talk = sub.add_parser("run", help="use a model: chat, embed, speak, paint or transcribe")
    talk.add_argument("name")
    talk.add_argument("prompt", nargs="?", help="the prompt (else stdin), or the audio file")
    talk.add_argument("--max-tokens", type=int, help="chat: the longest answer")
    talk.add_argument("-o", "--output", help="speech or an image: the file (default NAME.mp3/png)")
    talk.add_argument("--voice", default="alloy", help="speech: the voice (default alloy)")
    talk.set_defaults(handler=run)
    described = sub.add_parser("describe", help="everything about a deployment, events too")
    described.add_argument("name")
    described.add_argument("--events", type=int, default=10, help="how many (default 10)")
    described.add_argument("--json", action="store_true", help="the API's row and its events")
    described.set_defaults(handler=describe)
    happened = sub.add_parser("events", help="what happened to deployments, oldest first")
    happened.add_argument("name", nargs="?", help="one deployment's only")
    happened.add_argument("-n", "--tail", type=int, default=20, help="how many (default 20)")
    happened.add_argument("-f", "--follow", action="store_true", help="then each new one")
    happened.set_defaults(handler=events)
    usage.add_parsers(sub)
    store.add_parsers(sub)
    sign_in = sub.add_parser("login", help="save a site and its /api token for later commands")
    sign_in.add_argument("url", nargs="?", help=f"the site (default: {DEFAULT_URL})")
    sign_in.add_argument(
        "--token-file",
        metavar="PATH",
        help="a file holding the /api token (default: MODELSHIP_TOKEN, else asked, or stdin)",
    )
    sign_in.add_argument("--token", help=argparse.SUPPRESS)  # refused: seen in ps
    sign_in.add_argument(
        "--api-key-file", metavar="PATH", help="a file holding a /v1 key for `modelship run`"
    )
    sign_in.add_argument("--api-key", help=argparse.SUPPRESS)  # refused: seen in ps
    sign_in.set_defaults(handler=login)
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
