"""models.yaml: validation, deploy, reconcile, replace strategies."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml
from django.core.management import CommandError, call_command

from deployments import engine_secrets
from deployments.models import AuditEntry, Deployment, State
from deployments.models_yaml import ModelsFileError, load, parse
from tests.conftest import REPO, as_gateway, in_thread, pid_alive, reply_of

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.usefixtures("engines"), pytest.mark.postgres]


def write(tmp_path: Path, models: list[dict[str, Any]], name: str = "models.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def simulated(name: str, reply: str = "hi", **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "model": "simulated",
        "loader": "simulated",
        "memory_gib": 1,
        "simulated_config": {"reply": reply},
    }
    entry.update(extra)
    return entry


def deploy(path: Path, **options: Any) -> None:
    call_command("deploy", file=str(path), wait=True, **options)


def test_it_deploys_the_simulated_engine_until_it_answers(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("chat", "hello there", aliases=["c"])]))
    deployment = Deployment.objects.get(name="chat")
    assert deployment.state == State.READY
    assert deployment.aliases == ["c"]
    assert reply_of(deployment.engine_url) == "hello there"
    models = httpx.get(deployment.engine_url + "/v1/models", auth=as_gateway).json()
    assert [m["id"] for m in models["data"]] == ["chat", "c"]
    created = AuditEntry.objects.get(action="create", object_repr="chat")
    assert created.actor == "cli:deploy"
    assert (created.after or {})["model"] == "simulated"


def test_it_reports_every_problem_at_once_and_changes_nothing(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("keep")]))
    broken = write(
        tmp_path,
        [
            simulated("keep", reply="changed"),
            {"name": "a", "model": "x", "loader": "nope"},
            {"name": "b", "loader": "simulated", "colour": "red", "idel_timeout_s": 60},
            simulated("c", idle_timeout_s=5, mode="sometimes"),
            {**simulated("d"), "llama_server_config": {"n_ctx": 1}},
            {**simulated("e"), "simulated_config": {"tokens_per_minute": 3}},
            simulated("f", aliases=["keep"]),
            simulated("g", num_gpus=0.5),
        ],
        "broken.yaml",
    )
    with pytest.raises(CommandError) as failure:
        deploy(broken)
    message = str(failure.value)
    for expected in (
        "nothing was changed",
        "models[1] (a): loader: Value 'nope' is not a valid choice.",
        "models[2] (b): unknown key 'colour'",
        "models[2] (b): unknown key 'idel_timeout_s'; did you mean 'idle_timeout_s'?",
        "models[2] (b): 'model' is required",
        "models[3] (c): idle_timeout_s: Ensure this value is greater than or equal to 60.",
        "models[3] (c): mode: Value 'sometimes' is not a valid choice.",
        "models[4] (d): 'llama_server_config' does not belong to loader 'simulated'",
        "models[5] (e): simulated_config: unknown key 'tokens_per_minute'",
        "'keep' is served by both 'keep' and 'f'",
        "models[7] (g): memory_gib: give num_gpus or memory_gib, not both",
    ):
        assert expected in message
    assert list(Deployment.objects.values_list("name", flat=True)) == ["keep"]
    keep = Deployment.objects.get(name="keep")
    assert keep.config == {"reply": "hi"}
    assert reply_of(keep.engine_url) == "hi"


def test_it_rejects_a_file_that_is_not_a_models_list() -> None:
    with pytest.raises(ModelsFileError) as failure:
        parse({"model": []})
    assert failure.value.problems == ["the file must be a mapping with a 'models:' list"]


def test_it_reconciles_adding_removing_and_replacing(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("stay"), simulated("go"), simulated("change", "before")]))
    go = Deployment.objects.get(name="go")
    go_pid = go.runtime_handle["replicas"][0]["pid"]

    deploy(
        write(tmp_path, [simulated("stay"), simulated("change", "after"), simulated("new")]),
        reconcile=True,
    )
    assert sorted(Deployment.objects.values_list("name", flat=True)) == ["change", "new", "stay"]
    assert not pid_alive(go_pid)
    assert reply_of(Deployment.objects.get(name="change").engine_url) == "after"
    assert Deployment.objects.get(name="new").state == State.READY
    assert AuditEntry.objects.filter(action="delete", object_repr="go").exists()


def test_it_adds_without_removing_when_not_reconciling(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("one")]))
    deploy(write(tmp_path, [simulated("two")]))
    assert sorted(Deployment.objects.values_list("name", flat=True)) == ["one", "two"]


def test_it_leaves_an_unchanged_engine_alone(tmp_path: Path) -> None:
    path = write(tmp_path, [simulated("same")])
    deploy(path)
    pid = Deployment.objects.get(name="same").runtime_handle["replicas"][0]["pid"]
    deploy(path)
    assert Deployment.objects.get(name="same").runtime_handle["replicas"][0]["pid"] == pid
    assert not AuditEntry.objects.filter(action="update").exists()


def test_it_keeps_the_old_engine_serving_until_the_new_one_is_ready(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("bg", "old")]))
    old_pid = Deployment.objects.get(name="bg").runtime_handle["replicas"][0]["pid"]
    new_file = write(
        tmp_path,
        [simulated("bg", "new", simulated_config={"reply": "new", "startup_delay_s": 1.5})],
        "new.yaml",
    )
    worker = in_thread(deploy, new_file)
    seen: list[tuple[str, str]] = []
    while worker.is_alive():
        row = Deployment.objects.get(name="bg")
        seen.append((row.state, reply_of(row.engine_url, engine_secrets.auth(row))))
        time.sleep(0.05)
    worker.join()
    assert ("ready", "old") in seen
    assert all(state == "ready" for state, _ in seen)
    first_new = next(i for i, (_, reply) in enumerate([*seen, ("", "new")]) if reply == "new")
    assert all(reply == "old" for _, reply in seen[:first_new])
    assert reply_of(Deployment.objects.get(name="bg").engine_url) == "new"
    assert not pid_alive(old_pid)


def test_it_stops_then_starts_with_the_stop_start_strategy(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("ss", "old")]))
    deploy(write(tmp_path, [simulated("ss", "new")]), replace_strategy="stop_start")
    kinds = list(
        Deployment.objects.get(name="ss").events.order_by("id").values_list("kind", flat=True)
    )
    assert kinds == ["starting", "ready", "stopping", "stopped", "starting", "ready"]
    assert reply_of(Deployment.objects.get(name="ss").engine_url) == "new"


def test_it_does_not_start_an_on_demand_deployment(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("lazy", mode="on_demand", idle_timeout_s=60)]))
    lazy = Deployment.objects.get(name="lazy")
    assert lazy.state == State.PLANNED
    assert lazy.is_on_demand
    assert lazy.evictable  # by default, an idle one may be stopped to make room


def test_it_pins_a_deployment_that_may_not_be_stopped_to_make_room(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("pinned", mode="on_demand", evictable=False, preload=True)]))
    pinned = Deployment.objects.get(name="pinned")
    assert (pinned.evictable, pinned.preload) == (False, True)
    with pytest.raises(CommandError) as refused:
        deploy(write(tmp_path, [simulated("pinned", mode="on_demand", evictable="never")]))
    assert "models[0] (pinned): evictable:" in str(refused.value)


def test_it_measures_how_long_a_start_took(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("timed")]))
    timed = Deployment.objects.get(name="timed")
    assert timed.state == State.READY
    assert timed.start_s is not None and 0 < timed.start_s < 60  # a simulated engine's start


def test_it_reads_a_priority_by_name_or_number(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("vip", mode="on_demand", priority="high")]))
    assert Deployment.objects.get(name="vip").priority == 10
    deploy(write(tmp_path, [simulated("vip", mode="on_demand", priority=-3)]))
    assert Deployment.objects.get(name="vip").priority == -3
    with pytest.raises(CommandError) as refused:
        deploy(write(tmp_path, [simulated("vip", mode="on_demand", priority="urgent")]))
    assert "models[0] (vip): priority:" in str(refused.value)


def test_it_lets_a_stream_on_the_replaced_engine_finish(tmp_path: Path) -> None:
    # The stream outlasts the stop grace (2 s in tests): only draining lets it finish.
    deploy(write(tmp_path, [simulated("drain", simulated_config={"tokens_per_second": 10})]))
    old_url = Deployment.objects.get(name="drain").engine_url
    body = {
        "model": "drain",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 40,
    }
    new_file = write(tmp_path, [simulated("drain", "new")], "new.yaml")
    url = old_url + "/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30, auth=as_gateway) as answer:
        lines = answer.iter_lines()
        next(lines)
        # The replacement switches while this stream is half-way.
        worker = in_thread(deploy, new_file)
        rest = [line for line in lines if line.startswith("data: ")]
    worker.join()
    assert rest[-1] == "data: [DONE]"
    assert len(rest) == 40 + 1 + 1  # every token, the finish chunk, [DONE]
    assert reply_of(Deployment.objects.get(name="drain").engine_url) == "new"


def test_it_refuses_a_name_a_deployment_outside_the_file_serves(tmp_path: Path) -> None:
    deploy(write(tmp_path, [simulated("first", aliases=["shared"])]))
    with pytest.raises(CommandError) as failure:
        deploy(write(tmp_path, [simulated("second", aliases=["shared"])], "second.yaml"))
    assert "'shared' is served by both 'first' and 'second'" in str(failure.value)
    assert "rename or delete the one that holds it" in str(failure.value)  # and how
    assert not Deployment.objects.filter(name="second").exists()
    # Reconciling removes the first, so the name is free.
    deploy(
        write(tmp_path, [simulated("second", aliases=["shared"])], "second.yaml"), reconcile=True
    )
    assert list(Deployment.objects.values_list("name", flat=True)) == ["second"]


def test_it_takes_both_example_files() -> None:
    for name in ("models.yaml", "models.full.yaml"):
        declared = load(REPO / "examples" / name)
        assert {"chat", "voice", "ears"} <= {d["name"] for d in declared}, name
