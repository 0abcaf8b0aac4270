"""What every engine loader tells the control plane.

A loader knows one engine: the command line that starts it (the same argv serves the process
and the docker runtime), where its health answers, which Prometheus gauges show its load,
which OpenAI endpoints it serves, whether it can sleep, and how much memory it will need when
that can be known before it starts.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar

from common.spelling import unknown
from deployments import estimate, programs
from deployments.learned import learned_here
from deployments.loaders.defaults import UNKNOWN, RequestDefaults

# OpenAI-compatible paths (under /v1) by use case.
GENERATE_ENDPOINTS = ("chat/completions", "completions", "responses")
EMBED_ENDPOINTS = ("embeddings",)


def claimed_gib(deployment: Any) -> float | None:
    """The memory its engine is given: what the operator set, or more where a start that ran
    out of memory taught it needs more (deployments/out_of_memory.py)."""
    learned = learned_here(deployment)
    if deployment.memory_gib is None or not learned:
        return deployment.memory_gib  # type: ignore[no-any-return]
    return max(float(deployment.memory_gib), learned)


@dataclass(frozen=True)
class EngineSpec:
    """The parts of a deployment an engine's command line is built from (no ORM)."""

    name: str
    model: str
    usecase: str = "generate"
    aliases: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    num_gpus: float | None = None
    memory_gib: float | None = None
    # The size of the GPU it is placed on (GiB), known at launch on a GPU host.
    device_gib: float | None = None
    # Its LoRA adapters' files, in the order its engine loads them (deployments/adapters.py),
    # filled in at launch.
    adapters: tuple[str, ...] = ()
    lora: bool = False  # it has adapters (vLLM: --enable-lora, loaded as it runs)
    # Where llama.cpp saves and restores its slots' caches (deployments/kv_store.py), filled
    # in at launch where the deployment keeps them; "" none.
    slot_save_path: str = ""

    @classmethod
    def of(cls, deployment: Any) -> EngineSpec:
        from deployments.store.refs import resolved_or_same  # noqa: PLC0415 - a cycle: refs reads Deployment

        return cls(
            name=deployment.name,
            model=resolved_or_same(deployment.model),
            usecase=deployment.usecase,
            aliases=tuple(deployment.aliases or ()),
            config=dict(deployment.config or {}),
            num_gpus=deployment.num_gpus,
            memory_gib=claimed_gib(deployment),
        )

    @property
    def served_names(self) -> list[str]:
        return [self.name, *self.aliases]


SLEEPS = (
    "sleep, woken by the next request: level 1 (weights kept in host memory) while"
    " MSHIP_SLEEP_HOST_GIB holds them, else level 2 (weights dropped, reloaded at the wake);"
    " stopped after MSHIP_SLEEP_MAX_S asleep"
)
STOPS = "stop, started again by the next request"


class Loader:
    name: ClassVar[str]
    # The key of this loader's block in models.yaml (e.g. llama_server_config).
    config_key: ClassVar[str]
    # Options the loader understands, each with its help (the admin's form shows them as
    # fields); anything else in its block is an error. Empty: it takes none, or any (vLLM).
    config_options: ClassVar[dict[str, str]] = {}
    usecases: ClassVar[frozenset[str]]
    health_path: ClassVar[str] = "/health"
    # Prometheus gauges of requests running and waiting, read by make-room and the reaper.
    running_gauge: ClassVar[str | None] = None
    waiting_gauge: ClassVar[str | None] = None
    # How full its KV cache is (0 to 1), where its metrics say it: the replica choice
    # treats a nearly full one as at its bound (openai_api/routing/engine_load.py).
    kv_usage_gauges: ClassVar[tuple[str, ...]] = ()
    can_sleep_mode: ClassVar[bool] = False
    # It serves /v1/responses itself (a deployment may pass the endpoint to it).
    native_responses: ClassVar[bool] = False
    # How the engine counts a chat's tokens: "vllm" (POST /tokenize with the messages) or
    # "llama" (POST /apply-template, then /tokenize); None: it cannot.
    tokenizer: ClassVar[str | None] = None
    default_image: ClassVar[str] = ""
    # The engine's program: its name on PATH, the setting that names it on this host, and
    # where the engine's published image keeps it.
    binary_name: ClassVar[str] = ""
    binary_env: ClassVar[str] = ""
    container_binary: ClassVar[str] = ""
    # The option that sets the engine's context length in tokens, and the engine's own default
    # for it where it has one: no request may ask it for more output than that.
    context_option: ClassVar[str | None] = None
    context_default: ClassVar[int | None] = None
    # What a user who may change deployments but not run code on the host may pass to the
    # engine (deployments/host_access.py): flags, without their dashes, in `extra_args` (or
    # each key of the block where it is made of flags, vLLM's); none of them loads code,
    # reads or writes a path it is given, or moves the listening address. Anything else
    # needs run_arbitrary_engine.
    operator_flags: ClassVar[frozenset[str]] = frozenset()
    # Every key of the loader's block is an engine flag (vLLM's engine arguments).
    config_is_flags: ClassVar[bool] = False
    # Options whose values are host paths: confined to MSHIP_MODEL_DIRS like the model.
    path_options: ClassVar[tuple[str, ...]] = ()
    # `plugin:` names the engine's code (loader: custom).
    takes_plugins: ClassVar[bool] = False
    # The engine imports Python files a model folder holds (diffusers' custom components).
    imports_model_code: ClassVar[bool] = False
    # Its chat completions take a forced function as OpenAI writes it (`tool_choice`:
    # {"type": "function", "function": {"name": ...}}); llama.cpp's take only words.
    names_forced_tool: ClassVar[bool] = True
    # The environment variable its engine reads its API key from: each replica gets a secret
    # of its own there, which Modelship sends with every request (deployments/
    # engine_secrets.py). The engines Modelship ships read MSHIP_ENGINE_SECRET; "": none.
    secret_env: ClassVar[str] = "MSHIP_ENGINE_SECRET"

    @property
    def serves_metrics(self) -> bool:
        """Its engine serves Prometheus metrics (/metrics) with the load gauges above."""
        return self.running_gauge is not None

    def validate(self, spec: EngineSpec) -> list[str]:
        """Problems with a spec, each a sentence naming the key; empty when it is fine."""
        problems = []
        if spec.usecase not in self.usecases:
            allowed = ", ".join(sorted(self.usecases))
            problems.append(f"usecase {spec.usecase!r} is not served by {self.name} ({allowed})")
        if self.config_options:
            for key in sorted(set(spec.config) - set(self.config_options)):
                problems.append(f"{self.config_key}: {unknown(key, self.config_options, 'key')}")
        elif spec.config:
            problems.append(f"{self.name} takes no {self.config_key}")
        return problems

    def argv(self, spec: EngineSpec, host: str, port: str, container: bool = False) -> list[str]:
        """The command line; ``container`` when it runs in the loader's image."""
        raise NotImplementedError

    def program(self, spec: EngineSpec, container: bool = False) -> str | None:
        """The engine's own program: `binary:`, the image's in a container, else the one
        its setting names or the engines' PATH holds; None when there is none."""
        if spec.config.get("binary"):
            return str(spec.config["binary"])
        if container:
            return self.container_binary or self.binary_name
        return programs.find(self.binary_name, self.binary_env)

    def binary(self, spec: EngineSpec, container: bool = False) -> str:
        return self.program(spec, container) or self.binary_name

    def image(self, spec: EngineSpec) -> str:
        return self.default_image

    def docker_defaults(self, spec: EngineSpec) -> dict[str, Any]:
        """Container settings this engine wants unless the operator's docker block differs."""
        return {}

    def sees_images(self, spec: EngineSpec) -> bool:
        """Whether its chat takes image parts (a Responses `input_image` is refused with a
        400 naming the part where it does not)."""
        return False

    def schedules_by_priority(self, spec: EngineSpec) -> bool:
        """Its engine orders the requests it holds by a `priority` each carries (vLLM with
        `scheduling_policy: priority`): the gateway then sends each request's class. Others
        serve what they hold first come, first served (llama.cpp's slots)."""
        return False

    def batch_size(self, spec: EngineSpec) -> int:
        """Requests its engine serves at once without one waiting for another: the floor of
        the replica choice's load bound (openai_api/routing/choice.py)."""
        return 1

    def pinned_slots(self, spec: EngineSpec) -> int:
        """Slots of its engine the gateway pins each request to (llama.cpp's `id_slot`:
        openai_api/routing/slots.py); 0: the engine places requests itself."""
        return 0

    def reads_files(self, spec: EngineSpec) -> bool:
        """Its chat takes file parts (OpenAI's `file`: a PDF as data). vLLM's and llama.cpp's
        refuse them, so none does unless its loader says so."""
        return False

    def output_token_limit(self, spec: EngineSpec) -> int | None:
        """The most tokens one request may ask the engine to generate: its context length
        where its configuration says it, else its `max_output_tokens` option where it has
        one; None: not known here (the gateway's site default applies)."""
        if self.context_option:
            context = whole_number(spec.config.get(self.context_option)) or self.context_default
            if context:
                return context
        if "max_output_tokens" in self.config_options:
            return whole_number(spec.config.get("max_output_tokens"))
        return None

    def request_defaults(self, spec: EngineSpec) -> RequestDefaults:
        """What its engine makes a request with where the request sets nothing (sampling,
        answer length), as far as its configuration says it (deployments/loaders/defaults.py);
        nothing known by default."""
        return UNKNOWN

    def engine_family(self, spec: EngineSpec, container: bool = False) -> str | None:
        """The engine environment (deployments/engine_envs.py) its process runs on (in a
        container too, mounted from the host); None: Modelship's own Python, or a program of
        its own (in a container: the image's)."""
        return None

    def env(self, spec: EngineSpec) -> dict[str, str]:
        """Extra environment for the engine."""
        return {}

    def endpoints(self, spec: EngineSpec) -> tuple[str, ...]:
        """The /v1 paths this engine serves for the spec's use case."""
        raise NotImplementedError

    @property
    def idle_signal(self) -> str:
        """What on-demand idleness is judged by: the gateway's slots and release times
        always, and the engine's own load gauges where it has them."""
        return "slots and engine gauges" if self.serves_metrics else "slots"

    def can_sleep(self, spec: EngineSpec) -> bool:
        """Whether its engine, as this spec runs it on this host, sleeps (vLLM sleep mode):
        on-demand then puts it to sleep when idle instead of stopping it."""
        return self.can_sleep_mode

    def idle_action(self, spec: EngineSpec) -> str:
        """What on-demand does with it when it is idle or in another's way, as the
        deployment's page says it."""
        return SLEEPS if self.can_sleep(spec) else STOPS

    def memory_estimate(self, spec: EngineSpec) -> estimate.Estimate | None:
        """Memory the engine will hold, and of what, from the model's own metadata
        (deployments/estimate.py); None where it cannot be known without starting it."""
        return None

    def estimate_memory_gib(self, spec: EngineSpec) -> float | None:
        """What its engine is given where the deployment declares no memory."""
        found = self.memory_estimate(spec)
        return None if found is None else found.gib

    def sequences_fit(self, spec: EngineSpec, memory_gib: float) -> tuple[int, int] | None:
        """How many full-length sequences its KV cache holds in this memory, and how many it
        should hold at once; None where its cache is not counted in sequences."""
        return None


# vLLM's suffixes for a size in tokens: 16k is 16,000, 16K is 16,384.
SCALES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}
COUNT = re.compile(r"([0-9]{1,15}(?:\.[0-9]{1,6})?)([kmgKMG]?)")


def whole_number(value: Any) -> int | None:
    """A positive whole number given as a number or as digits (with vLLM's suffixes);
    None for anything else."""
    if isinstance(value, str) and (match := COUNT.fullmatch(value.strip())):
        value = int(Decimal(match[1]) * SCALES[match[2]])
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def file_size_gib(path: str) -> float | None:
    """A model file's size, or a model folder's (every file in it); None if it is absent."""
    try:
        if os.path.isdir(path):
            files = (os.path.join(top, name) for top, _, names in os.walk(path) for name in names)
            return sum(os.path.getsize(f) for f in files) / 2**30
        return os.path.getsize(path) / 2**30
    except OSError:
        return None


def whole_number_problems(loader: Loader, spec: EngineSpec, *options: str) -> list[str]:
    """Options that become an engine flag's value must be whole numbers: a string there
    could read as another flag."""
    return [
        f"{loader.config_key}: {option} is a whole number from 0 to 2^31"
        for option in options
        if option in spec.config
        and not (
            isinstance(spec.config[option], int)
            and not isinstance(spec.config[option], bool)
            and 0 <= spec.config[option] < 2**31
        )
    ]


def extra_args_problems(loader: Loader, spec: EngineSpec) -> list[str]:
    extra = spec.config.get("extra_args", [])
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        return [f"{loader.config_key}: 'extra_args' must be a list of strings"]
    return []


def cli_flags(options: dict[str, Any]) -> list[str]:
    """Engine options as command-line flags: snake_case keys become --kebab-case."""
    argv: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, dict | list):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv
