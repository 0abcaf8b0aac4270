"""llama.cpp's own HTTP server, from the `xllamacpp` wheel, behind llama-server's flags.

Where no `llama-server` binary is installed, the llama_server loader runs this module with
the same command line: xllamacpp embeds llama.cpp's C++ server (the same routes, /health,
/metrics and the OpenAI endpoints), prebuilt for CPUs, so a laptop serves a GGUF with
nothing but pip. SIGTERM or SIGINT shuts the server down cleanly.

    python -m deployments.engines.llama_launcher -m MODEL.gguf --host H --port P [...]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

POOLING = {"none": "NONE", "mean": "MEAN", "cls": "CLS", "last": "LAST", "rank": "RANK"}


def parser() -> argparse.ArgumentParser:
    # No abbreviations: an option is read only as spelled (see exact_options).
    p = argparse.ArgumentParser(prog="llama_launcher", description=__doc__, allow_abbrev=False)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-a", "--alias", default="")
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=0)
    p.add_argument("-np", "--parallel", type=int, default=1)
    p.add_argument("-t", "--threads", type=int, default=0)
    p.add_argument("--embedding", "--embeddings", action="store_true")
    p.add_argument("--pooling", choices=sorted(POOLING))
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--jinja", action="store_true")
    # The most tokens an answer may have (-1: up to the context), and the default length of
    # a request that names none.
    p.add_argument("-n", "--predict", "--n-predict", type=int, default=-1)
    # Sampling for a request that sets none (a model card's recommended settings).
    p.add_argument("--temp", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--repeat-penalty", type=float)
    # LoRA adapters, loaded at start; with --lora-init-without-apply each is off (scale 0)
    # until a request's `lora` field sets its scale.
    p.add_argument("--lora", action="append", default=[])
    p.add_argument("--lora-init-without-apply", action="store_true")
    # Where `POST /slots/{id}?action=save|restore` writes and reads (deployments/kv_store.py).
    p.add_argument("--slot-save-path", default="")
    return p


def exact_options(p: argparse.ArgumentParser, argv: list[str]) -> None:
    """Refuse an option not spelled as one of ours: argparse would read `-mlock` or
    `-mg=x` as `-m lock` and `-m g=x`, where llama-server reads other options (the control
    plane checks extra_args by llama-server's reading)."""
    known = set(p._option_string_actions)  # every spelling of every option
    for arg in argv:
        number = arg.lstrip("-").replace(".", "", 1).isdigit()  # a negative number
        if arg.startswith("-") and not number and arg.split("=", 1)[0] not in known:
            p.error(f"unrecognized option: {arg}")


def params_of(args: argparse.Namespace) -> Any:
    import xllamacpp  # noqa: PLC0415 - loads the native library; --help needs none

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_gpu_layers = args.n_gpu_layers
    params.n_parallel = args.parallel
    params.endpoint_metrics = args.metrics
    params.use_jinja = args.jinja
    params.n_predict = args.predict
    if args.slot_save_path:
        params.slot_save_path = args.slot_save_path
    # The API key from llama-server's own variable, never the command line (`ps` shows it):
    # every route but /health then asks for it (deployments/engine_secrets.py).
    keys = [k for k in os.environ.get("LLAMA_API_KEY", "").split(",") if k]
    if keys:
        params.api_keys = keys
    sampling = params.sampling
    for name, value in (
        ("temp", args.temp),
        ("top_p", args.top_p),
        ("penalty_repeat", args.repeat_penalty),
    ):
        if value is not None:
            setattr(sampling, name, value)
    params.sampling = sampling
    params.embedding = args.embedding
    if args.alias:
        params.model_alias = {a.strip() for a in args.alias.split(",") if a.strip()}
    if args.threads > 0:
        params.cpuparams.n_threads = args.threads
        params.cpuparams_batch.n_threads = args.threads
    if args.lora:
        scale = 0.0 if args.lora_init_without_apply else 1.0  # xllamacpp: off by its scale
        params.lora_adapters = [xllamacpp.CommonAdapterLoraInfo(p, scale) for p in args.lora]
        params.lora_init_without_apply = args.lora_init_without_apply
    if args.pooling:
        kind = POOLING[args.pooling]
        params.pooling_type = getattr(xllamacpp.llama_pooling_type, f"LLAMA_POOLING_TYPE_{kind}")
    return params


def main(argv: list[str] | None = None) -> None:
    p = parser()
    exact_options(p, sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    import xllamacpp  # noqa: PLC0415 - loads the native library; --help needs none

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"llama_launcher: loading {args.model} (xllamacpp)", flush=True)
    try:
        server = xllamacpp.Server(params_of(args))
    except Exception as exc:  # the model would not load: say why, as llama-server does
        print(f"llama_launcher: could not start: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from exc
    print(f"llama_launcher: serving on {server.listening_address}", flush=True)
    stop.wait()
    del server  # its destructor stops the HTTP server and the main loop


if __name__ == "__main__":
    main()
