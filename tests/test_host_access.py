"""Changing a deployment is not running code on the host: a user with `change_deployment`
(and `add_deployment`) but not `run_arbitrary_engine` cannot make any loader run a program,
load code, read or write a path or listen elsewhere, through any field (deployments/
host_access.py). Table-driven over every loader's options."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from deployments import engine_envs, operations
from deployments.engines.llama_launcher import exact_options, parser
from deployments.engines.tts_backends import piper_model
from deployments.loaders import LOADERS, EngineSpec
from deployments.models import Deployment
from deployments.refusals import OperationRefused

if TYPE_CHECKING:
    from pathlib import Path


EDITOR_PERMS = ("view_deployment", "change_deployment", "add_deployment")
PWN = "/tmp/pwned-by-editor"
# What an attacker writes into a field: a flag, a flag with its value, a path, both.
ATTACKS: tuple[Any, ...] = (
    "--trust-remote-code",
    f"--log-file={PWN}",
    PWN,
    [f"--log-file={PWN}"],
    ["--host", "0.0.0.0"],
    ["--path", "/"],
    {"flag": "--trust-remote-code"},
)
# A deployment each loader accepts, to which one attack at a time is added.
BASE: dict[str, dict[str, Any]] = {
    "vllm": {"model": "org/model", "usecase": "generate", "memory_gib": 1},
    "llama_server": {"model": "org/model", "usecase": "generate"},
    "diffusers": {"model": "org/model", "usecase": "image"},
    "stable_diffusion_cpp": {"model": "org/model", "usecase": "image"},
    "whispercpp": {"model": "org/model", "usecase": "transcription"},
    "faster_whisper": {"model": "org/model", "usecase": "transcription"},
    "tts": {"model": "espeak", "usecase": "tts", "config": {"backend": "espeak"}},
    "custom": {"model": "m", "usecase": "tts", "config": {"plugin": "tone"}},
    "simulated": {"model": "simulated", "usecase": "generate", "memory_gib": 1},
}
# vLLM takes any engine argument: these load code, read or write a path, or move it.
VLLM_DANGEROUS = (
    "trust_remote_code",
    "tool_parser_plugin",
    "worker_extension_cls",
    "chat_template",
    "download_dir",
    "allowed_local_media_path",
    "middleware",
    "host",
    "ssl_keyfile",
    "logits_processors",
    "generation_config",
    "hf_overrides",
)


@pytest.fixture
def editor(transactional_db: None) -> User:
    user = User.objects.create_user("editor", password="pw-123456", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=EDITOR_PERMS))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def root(transactional_db: None) -> User:
    return User.objects.create_superuser("root", "r@example.com", "pw-123456")


def as_api(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def attempts(name: str) -> list[tuple[str, Any]]:
    """(option, value): every option of a loader with every attack, the model and the
    aliases too, and vLLM's code-loading arguments."""
    options = [*LOADERS[name].config_options, *(VLLM_DANGEROUS if name == "vllm" else ())]
    return [(option, attack) for option in ["model", "aliases", *options] for attack in ATTACKS]


def deployment_values(loader: str, option: str, value: Any) -> dict[str, Any]:
    base = BASE[loader]
    values = {"name": f"x-{loader}", "loader": loader, "runtime": "process", **base}
    if option in ("model", "aliases"):
        values[option] = value
    else:
        values["config"] = {**base.get("config", {}), option: value}
    return values


def attacker_parts(argv: list[str], baseline: list[str], value: Any) -> list[str]:
    """The arguments of a command line that came from the attack: a flag or path it named
    that the loader's own command line does not have, outside a shipped engine's --config
    JSON (which its own server reads as data)."""
    words = {w.strip(",[]{}:") for w in json.dumps(value).replace('"', " ").split()}
    words = {part for w in words for part in w.split("=")} - {"", "flag"}

    def named(line: list[str]) -> Counter[str]:
        after_config = {i + 1 for i, arg in enumerate(line) if arg == "--config"}
        return Counter(
            part
            for i, arg in enumerate(line)
            if i not in after_config
            for part in arg.split("=")
            if part in words
        )

    return sorted((named(argv) - named(baseline)).elements())


@pytest.mark.parametrize("loader", list(LOADERS))
def test_it_lets_no_field_of_any_loader_run_what_an_editor_chose(db: None, loader: str) -> None:
    editor = User.objects.create_user("editor", password="pw-123456", is_staff=True)
    editor.user_permissions.set(Permission.objects.filter(codename__in=EDITOR_PERMS))
    editor = User.objects.get(pk=editor.pk)
    plain = Deployment(**{"name": f"x-{loader}", "loader": loader, **BASE[loader]})
    baseline = LOADERS[loader].argv(EngineSpec.of(plain), "127.0.0.1", "9000")
    refused = 0
    for option, value in attempts(loader):
        deployment = Deployment(**deployment_values(loader, option, value))
        try:
            deployment.full_clean()  # the field checks every door makes first
            operations.create(deployment, editor)
        except ValidationError:
            refused += 1
            continue
        except OperationRefused as exc:
            assert exc.status in (400, 403)
            refused += 1
            continue
        # Saved: the option is one an editor may set. Its command line holds none of it.
        argv = LOADERS[loader].argv(EngineSpec.of(deployment), "127.0.0.1", "9000")
        deployment.delete()
        assert argv[0] == baseline[0]  # the same program
        assert attacker_parts(argv, baseline, value) == [], (option, value, argv)
    assert refused  # every loader has something to refuse: at least its model path


@pytest.mark.parametrize(
    ("loader", "config", "field", "named"),
    [
        ("vllm", {"trust_remote_code": True}, "config.trust_remote_code", "--trust-remote-code"),
        ("vllm", {"tool_parser_plugin": "/x.py"}, "config.tool_parser_plugin", "plugin"),
        ("vllm", {"max_model_len": "--trust-remote-code"}, "config.max_model_len", "--max"),
        ("llama_server", {"extra_args": ["--log-file", "/x"]}, "config.extra_args", "--log-file"),
        ("llama_server", {"extra_args": ["--log-file=/x"]}, "config.extra_args", "--log-file"),
        ("llama_server", {"mmproj": "/etc/passwd"}, "config.mmproj", "/etc/passwd"),
        ("whispercpp", {"extra_args": ["--public", "/"]}, "config.extra_args", "--public"),
        ("stable_diffusion_cpp", {"vae": "/etc/x"}, "config.vae", "/etc/x"),
        ("custom", {"plugin": "evil-package"}, "config.plugin", "evil-package"),
    ],
)
def test_it_names_the_flag_an_editor_may_not_set_and_lets_a_superuser(
    editor: User, root: User, loader: str, config: dict[str, Any], field: str, named: str
) -> None:
    values = deployment_values(loader, "config", None)
    values["config"] = {**BASE[loader].get("config", {}), **config}
    answer = as_api(editor).post("/api/deployments/", values, format="json")
    assert answer.status_code == 403, answer.content
    assert list(answer.json()) == [field] and named in answer.json()[field][0]
    assert "run_arbitrary_engine" in answer.json()[field][0]
    assert not Deployment.objects.exists()
    assert as_api(root).post("/api/deployments/", values, format="json").status_code == 201


def test_it_lets_an_editor_tune_an_engine(editor: User) -> None:
    api = as_api(editor)
    tuned = [
        ("vllm", {"max_model_len": 4096, "enforce_eager": True, "dtype": "float32"}),
        ("vllm", {"kv_offloading_size": 8, "kv_offloading_backend": "native"}),
        ("llama_server", {"n_ctx": 2048, "extra_args": ["--temp", "0.5", "-fa", "on"]}),
        ("llama_server", {"extra_args": ["--rope-freq-scale", "-1", "--mlock"]}),
        ("whispercpp", {"threads": 2, "extra_args": ["-bs", "5"]}),
        ("stable_diffusion_cpp", {"extra_args": ["--steps", "4", "--vae-tiling"]}),
    ]
    for i, (loader, config) in enumerate(tuned):
        values = {**deployment_values(loader, "config", None), "name": f"t{i}", "config": config}
        answer = api.post("/api/deployments/", values, format="json")
        assert answer.status_code == 201, (loader, answer.content)


def test_it_refuses_an_alias_that_reads_as_a_flag_from_anyone(root: User) -> None:
    for alias in ("--host=0.0.0.0", "--trust-remote-code", "-m", "a b", "x\ny"):
        values = {**deployment_values("vllm", "aliases", [alias])}
        answer = as_api(root).post("/api/deployments/", values, format="json")
        assert answer.status_code == 400 and "aliases" in answer.json(), alias
    model = {**deployment_values("vllm", "model", "--trust-remote-code")}
    answer = as_api(root).post("/api/deployments/", model, format="json")
    assert answer.status_code == 400 and "model" in answer.json()


def test_it_keeps_an_editors_model_paths_in_the_model_folders(
    editor: User, tmp_path: Path, settings: Any
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / "m.gguf").write_bytes(b"GGUF")
    (models / "escape").symlink_to("/etc")
    settings.MSHIP_MODEL_DIRS = [str(models)]
    api = as_api(editor)
    refused = (
        "/var/run/docker.sock",
        "/etc/passwd",
        str(models / "escape" / "passwd"),  # a symlink out of the folder
        str(models / ".." / "other.gguf"),
        "var/models/../../../etc/passwd",  # relative paths are read from the site's folder
        "~/.ssh/id_rsa",
    )
    for i, model in enumerate(refused):
        values = {**deployment_values("llama_server", "model", model), "name": f"p{i}"}
        answer = api.post("/api/deployments/", values, format="json")
        assert answer.status_code == 403 and list(answer.json()) == ["model"], model
        assert "MSHIP_MODEL_DIRS" in answer.json()["model"][0]
    relative = os.path.relpath(models / "m.gguf", settings.BASE_DIR)
    allowed = (str(models / "m.gguf"), relative, "Qwen/Qwen3-8B", "tiny")
    for i, model in enumerate(allowed):
        values = {**deployment_values("llama_server", "model", model), "name": f"a{i}"}
        assert api.post("/api/deployments/", values, format="json").status_code == 201


def test_it_lets_an_editor_change_what_an_administrator_gave_reach(
    editor: User, root: User
) -> None:
    values = deployment_values("vllm", "config", None)
    values["config"] = {"trust_remote_code": True, "max_model_len": 1024}
    created = as_api(root).post("/api/deployments/", values, format="json")
    url = f"/api/deployments/{created.json()['id']}/"
    api = as_api(editor)
    assert api.patch(url, {"idle_timeout_s": 300}, format="json").status_code == 200
    more = {"config": {**values["config"], "tool_parser_plugin": "/x.py"}}
    assert api.patch(url, more, format="json").status_code == 403
    less = {"config": {"max_model_len": 2048}}  # taking reach away needs no permission
    assert api.patch(url, less, format="json").status_code == 200
    assert Deployment.objects.get().config == {"max_model_len": 2048}


def test_it_installs_only_the_plugin_version_an_administrator_allowed(
    editor: User, settings: Any
) -> None:
    values = deployment_values("custom", "config", None)
    values["config"] = {"plugin": "modelship-echo"}
    api = as_api(editor)
    assert api.post("/api/deployments/", values, format="json").status_code == 403
    settings.MSHIP_PLUGINS = ["modelship-echo == 1.2.0", "not a requirement"]
    assert api.post("/api/deployments/", values, format="json").status_code == 201
    requirements = engine_envs.requirements(engine_envs.plugin_family("modelship-echo"))
    assert requirements.splitlines()[-1] == "modelship-echo==1.2.0"


def test_it_keeps_what_runs_fixed_on_a_deployment_an_administrator_gave_reach(
    editor: User, root: User
) -> None:
    values = deployment_values("vllm", "config", None)
    values["config"] = {"trust_remote_code": True, "revision": "0123abcd"}
    created = as_api(root).post("/api/deployments/", values, format="json")
    url = f"/api/deployments/{created.json()['id']}/"
    api = as_api(editor)
    for change in (
        {"model": "attacker/evil-remote-code"},  # trust_remote_code was for org/model
        {"config": {**values["config"], "revision": "refs/pr/7"}},
        {"runtime": "docker"},
    ):
        answer = api.patch(url, change, format="json")
        assert answer.status_code == 403, change
        assert set(answer.json()) <= {"model", "config", "runtime", "loader", "usecase"}
    logs = {"extra_args": ["--log-file", "/var/log/engine.log"]}
    llama = {**deployment_values("llama_server", "config", None), "name": "l", "config": logs}
    made = as_api(root).post("/api/deployments/", llama, format="json").json()
    url = f"/api/deployments/{made['id']}/"
    for extra in (["--log-file", "/root/.bashrc"], ["--log-file", "/x", "--log-file", "/y"]):
        answer = api.patch(url, {"config": {"extra_args": extra}}, format="json")
        assert answer.status_code == 403 and "config.extra_args" in answer.json(), extra


def test_it_refuses_a_file_option_that_is_not_a_path_and_flags_that_log_prompts(
    editor: User,
) -> None:
    api = as_api(editor)
    for loader, config in (
        ("llama_server", {"mmproj": ["/etc/passwd"]}),
        ("vllm", {"enable_log_requests": True}),
        ("vllm", {"max_log_len": 100000}),
        ("stable_diffusion_cpp", {"extra_args": ["--verbose"]}),
    ):
        values = {**deployment_values(loader, "config", None), "config": config}
        answer = api.post("/api/deployments/", values, format="json")
        assert answer.status_code in (400, 403), (loader, config)


def test_it_finds_a_piper_voice_package_without_running_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "evil_voice"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    (package / "data" / "v.onnx").write_bytes(b"onnx")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert piper_model("evil-voice") == package / "data" / "v.onnx"
    assert not (tmp_path / "ran").exists()
    for name in ("venv.__main__", "this", "os.path"):  # modules, not voice packages
        with pytest.raises(SystemExit):
            piper_model(name)


def test_it_reads_the_llama_launchers_options_only_as_spelled() -> None:
    p = parser()
    exact_options(p, ["-m", "x.gguf", "-c", "2048", "--ctx-size=4096", "-ngl", "-1"])
    for smuggled in ("-mlock", "-mg=/etc/passwd", "--mod", "--log-file"):
        with pytest.raises(SystemExit):
            exact_options(p, ["-m", "x.gguf", smuggled])


def test_it_takes_a_model_folder_with_python_code_as_code(
    editor: User, tmp_path: Path, settings: Any
) -> None:
    folder = tmp_path / "models" / "pipe"
    (folder / "unet").mkdir(parents=True)
    (folder / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    settings.MSHIP_MODEL_DIRS = [str(tmp_path / "models")]
    values = {**deployment_values("diffusers", "model", str(folder)), "name": "plain"}
    assert as_api(editor).post("/api/deployments/", values, format="json").status_code == 201
    (folder / "unet" / "my_unet.py").write_text("import os\n")
    values["name"] = "custom"
    answer = as_api(editor).post("/api/deployments/", values, format="json")
    assert answer.status_code == 403 and "my_unet.py" in answer.json()["model"][0]
