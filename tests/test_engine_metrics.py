"""Load gauges read from engines' Prometheus text, whatever labels a version adds."""

from __future__ import annotations

from deployments.engine_metrics import parse_gauges

LLAMA = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
llamacpp:requests_deferred 1
llamacpp:prompt_tokens_total 100
"""

VLLM = """vllm:num_requests_running{engine="0",model_name="a"} 1.0
vllm:num_requests_running{engine="1",model_name="a"} 2.0
vllm:num_requests_waiting{engine="0",model_name="a"} 0.0
vllm:num_requests_waiting_by_reason{reason="x"} 7
garbage line
"""


def test_it_reads_llama_cpp_gauges() -> None:
    names = {"llamacpp:requests_processing", "llamacpp:requests_deferred"}
    assert parse_gauges(LLAMA, names) == {
        "llamacpp:requests_processing": 2.0,
        "llamacpp:requests_deferred": 1.0,
    }


def test_it_sums_labelled_vllm_series_and_ignores_lookalikes() -> None:
    names = {"vllm:num_requests_running", "vllm:num_requests_waiting"}
    assert parse_gauges(VLLM, names) == {
        "vllm:num_requests_running": 3.0,
        "vllm:num_requests_waiting": 0.0,
    }
