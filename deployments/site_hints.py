"""What a site should set for where it runs: on a bare host (not in a container), the two
defaults that only work inside Docker. `serve` (make run) and `gpu_check` print them.

In the compose file (compose.yaml) Modelship runs on the engines' network: the on-demand
gateway's `auto` peer policy admits that network, and MSHIP_INTERNAL_URL names the service,
so neither needs setting there.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings

from deployments.runtimes.docker_network import in_container

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def hints() -> list[str]:
    if in_container():
        return []
    found = []
    if settings.MSHIP_ONDEMAND_ALLOWED_CIDRS.strip().lower() == "auto":
        found.append(
            "MSHIP_ONDEMAND_ALLOWED_CIDRS: 'auto' admits only peers on Modelship's own Docker"
            " networks, and outside a container that is nobody: list the networks of the"
            " callers of /ondemand (your LiteLLM proxy's, e.g. 172.17.0.0/16)"
        )
    if settings.MSHIP_LITELLM_URL and urlsplit(settings.MSHIP_INTERNAL_URL).hostname in LOOPBACK:
        found.append(
            f"MSHIP_INTERNAL_URL: LiteLLM is given {settings.MSHIP_INTERNAL_URL}, which a"
            " LiteLLM container cannot reach: set this host's address on its network (e.g."
            " http://172.17.0.1:8000)"
        )
    return found
