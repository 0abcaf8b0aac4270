# Modelship: `make run` starts it on its embedded defaults; `make test` runs the whole suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The versions CI tested: every install is constrained by the lock file.
LOCK := requirements.lock
HASH := $(shell cat pyproject.toml $(LOCK) | sha1sum | cut -c1-12)
RUN_STAMP := $(VENV)/.installed-run-$(HASH)
DEV_STAMP := $(VENV)/.installed-dev-$(HASH)
# The suite runs twice: on the embedded defaults (SQLite, ORM broker) and on PostgreSQL + Redis.
PG_URL ?= postgres://postgres@127.0.0.1:5432/modelship
REDIS ?= redis://127.0.0.1:6379/0

# Python writes its byte-code caches, whatever the calling environment says: a machine that
# sets PYTHONDONTWRITEBYTECODE (this project's machines do) otherwise compiles Django and
# every module from source in each of the hundreds of processes a test run starts (2.3 s to
# load the gateway's code, against 0.8 s from the caches).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup setup-run system-deps browser-deps engine-envs run test test-sqlite test-postgres lint format lock clean bench

# What serving needs (make run): no test tools, SDKs or LiteLLM. Installed by uv (pip where
# uv cannot run: common/installer.py), from pip's configured indexes.
$(RUN_STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m common.installer $(VENV) $(LOCK) -e .
	rm -f $(VENV)/.installed-run-* && touch $@

# And the dev extra (make test, make lint).
$(DEV_STAMP): $(RUN_STAMP)
	$(PYTHON) -m common.installer $(VENV) $(LOCK) -e '.[dev]'
	rm -f $(VENV)/.installed-dev-* && touch $@

setup-run: $(RUN_STAMP)

setup: $(DEV_STAMP)

# Debian packages the engines use: espeak-ng (the zero-dependency voice) and ffmpeg (speech
# in mp3, opus, aac and flac).
system-deps:
	@scripts/debian-packages.sh espeak-ng:espeak-ng ffmpeg:ffmpeg

# And for the tests: Debian's Chromium and its driver (the live admin in a real browser), and
# wrk (the benchmarks' load generator, bench/wrk.py; their smoke run uses it too).
# After system-deps: two apt-get runs side by side (make -j2) fail on dpkg's lock.
browser-deps: system-deps
	@scripts/debian-packages.sh chromium:chromium chromedriver:chromium-driver wrk:wrk

# Every engine environment this host runs, made into the machine-wide cache before the suite
# (several at once; nothing to do where they are there): no test waits on an install.
engine-envs: setup
	$(PY) manage.py engine_env install --all

run: setup-run
	@$(MAKE) --no-print-directory system-deps || echo "Without espeak-ng and ffmpeg (Debian" \
		"packages), speech is wav and pcm only and transcription reads WAV only."
	$(PY) manage.py migrate --noinput
	$(PY) manage.py fetch_example_model smollm2 --into var/models
	$(PY) manage.py make_tiny_model var/models/tiny-embed.gguf --embedding --if-missing
	$(PY) manage.py make_tiny_model var/models/tiny-whisper.bin --kind whisper --if-missing
	$(PY) manage.py serve --models examples/models.yaml

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy .

# Every run names its 20 slowest tests and the modules over their time budget
# (tests/time_budgets.toml); `scripts/timed.sh` says how long each phase took.
# The suite runs on TEST_WORKERS processes (pytest-xdist; 0 for none), each taking a test
# module (or the modules sharing a session's cluster) whole: tests/parallel_env.py.
TEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -q -p no:cacheprovider --durations=20 -p tests.parallel_env \
	-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

test-sqlite: setup system-deps browser-deps
	MSHIP_Q_NAME=modelship-test scripts/timed.sh "tests on SQLite" $(PYTEST)

# Only what differs on PostgreSQL + Redis runs again: the tests marked postgres, redis or as
# their API family's sample (tests/conftest.py); the rest ran on SQLite, as did the heavy
# real-engine suites (marked heavy): they do not depend on the database.
test-postgres: setup system-deps browser-deps
	DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS) MSHIP_Q_NAME=modelship-test MSHIP_TEST_HEAVY=0 \
		MSHIP_TEST_BACKENDS_ONLY=1 scripts/timed.sh "tests on PostgreSQL + Redis" $(PYTEST)

# A Docker Engine for the docker runtime's tests: the running one, else one started (and, as
# root on Debian, installed) for the run and stopped after it. The two back-ends' runs go one
# after the other: side by side on two cores they took longer (each keeps a core busy with the
# engines and servers it starts; README, Development).
test:
	@scripts/timed.sh "setup, lint and engine environments" $(MAKE) --no-print-directory -j2 \
		--output-sync=target lint engine-envs system-deps browser-deps
	scripts/docker-up.sh
	status=0; $(MAKE) test-sqlite test-postgres || status=$$?; scripts/docker-down.sh; exit $$status

# Every benchmark of bench/ (about twenty minutes); the figures go to bench/results.md.
bench: setup system-deps
	@scripts/debian-packages.sh wrk:wrk
	$(PY) bench/run_all.py

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Rewrite the lock file from a .venv that passes make test.
lock: setup
	{ echo "# pip constraints: the versions CI tested (make lock rewrites it from a working .venv)."; \
		$(PY) -m pip freeze --exclude-editable; } > $(LOCK)

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache
