# Modelship in a container, as compose.yaml runs it: `python -m modelship_site.container web`
# (the default: migrations, then the gateway and API on 0.0.0.0:8000) or `... cluster` (the
# django-q cluster). It drives the host's Docker Engine through its socket and reads the
# GPUs through NVML (compose.yaml mounts the one and requests the others).
#
# BASE: an image with Python 3.11 (by default the official slim one, which needs the package
# index), or one that already holds the virtualenv /opt/modelship with every dependency
# installed, which needs none (the test suite builds from such a base, imported locally).
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ENV VIRTUAL_ENV=/opt/modelship \
    PATH=/opt/modelship/bin:/usr/local/bin:/usr/bin:/bin \
    PYTHONUNBUFFERED=1 \
    MSHIP_IN_CONTAINER=1 \
    MSHIP_VAR_DIR=/var/lib/modelship
WORKDIR /srv/modelship

COPY pyproject.toml scripts/container_install.py ./
RUN ["python3", "container_install.py"]

COPY . .
EXPOSE 8000
CMD ["python", "-m", "modelship_site.container", "web"]
