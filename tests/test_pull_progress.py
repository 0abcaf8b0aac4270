"""An image pull's progress line: layers and bytes from Docker's events, at most once a second."""

from __future__ import annotations

from typing import Any

from deployments.runtimes.pull_progress import PullProgress


def test_it_tells_layers_and_bytes_at_most_once_a_second() -> None:
    now = [0.0]
    told: list[str] = []
    pull = PullProgress("vllm/vllm-openai:v0.32.0", told.append, clock=lambda: now[0])
    events: list[dict[str, Any]] = [
        {"status": "Pulling from vllm/vllm-openai", "id": "v0.32.0"},
        {"status": "Pulling fs layer", "id": "a1"},
        {"status": "Pulling fs layer", "id": "b2"},
        {
            "status": "Downloading",
            "id": "a1",
            "progressDetail": {"current": 10**6, "total": 4 * 10**6},
        },
        {
            "status": "Downloading",
            "id": "b2",
            "progressDetail": {"current": 10**6, "total": 6 * 10**6},
        },
    ]
    for event in events:
        pull.update(event)
    assert told == ["pulling image vllm/vllm-openai:v0.32.0: 0 of 1 layers"]  # the first event
    now[0] = 1.5
    pull.update({"status": "Pull complete", "id": "a1"})
    assert told[-1] == "pulling image vllm/vllm-openai:v0.32.0: 1 of 2 layers, 5.0 of 10.0 MB"
    pull.update(
        {
            "status": "Downloading",
            "id": "b2",
            "progressDetail": {"current": 5 * 10**6, "total": 6 * 10**6},
        }
    )
    assert len(told) == 2  # within the second: not told
    now[0] = 2.6
    pull.update({"status": "Already exists", "id": "c3"})
    assert told[-1] == "pulling image vllm/vllm-openai:v0.32.0: 2 of 3 layers, 9.0 of 10.0 MB"
