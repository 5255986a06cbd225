# PASSING — see README.md. `make help` lists the targets.
SHELL := /bin/bash
P4C ?= p4c-bm2-ss
BUILD ?= build
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: help setup build build-tofino update-p4info test test-all test-other-k test-python-pipeline test-numpy-window lint bench bench-quick bench-bmv2 bench-model bench-stragglers bench-loss bench-controller sim sim-validate sim-study run-topology stop docker-run-topology clean

help:
	@echo "make setup         install Debian packages (as root), .venv and pinned Python deps"
	@echo "make build         compile p4src/ with $(P4C) into $(BUILD)/k<K>/ (BMv2 JSON + P4Info"
	@echo "                   text); K, values per packet: PASSING_K=64|128|256|320 (default 320), docs/protocol.md"
	@echo "make update-p4info build, then copy the P4Info to p4src/ (after changing p4src/)"
	@echo "make build-tofino  compile p4src/tna/ for Tofino 2 with p4c-barefoot into $(BUILD)/tna-tofino2/"
	@echo "                   and print the chip resources it takes (docs/tofino.md)"
	@echo "make test          check an install in about 5 minutes: unit tests, the conformance suite"
	@echo "                   on every installed target, one Mininet run end to end"
	@echo "make test-all      every test (what .ci/run runs); BMv2/p4c tests skip when those are missing"
	@echo "make test-other-k  the conformance suite (model, BMv2) at every K but PASSING_K's"
	@echo "make test-python-pipeline  the conformance suite on the model with every frame through"
	@echo "                   its Python pipeline (make test runs the model's compiled PASSING path)"
	@echo "make lint          ruff"
	@echo "make bench         every strategy (passing, ina, ring, hier-ring, ps) in Mininet:"
	@echo "                   CSVs in build/bench, plots + results in docs/benchmarks.md (root)"
	@echo "make bench-quick   the same in CI size: small tensors, correctness of every strategy"
	@echo "make bench-bmv2    aggregation packets/s vs plain forwarding on the same BMv2"
	@echo "make bench-model   the same for the software switch model"
	@echo "make bench-stragglers  training with one host 2x slower: bulk-synchronous vs quorum"
	@echo "                   (star, model; CSV, JSON, plot in build/stragglers; root)"
	@echo "make bench-loss    all-reduce with 1% and 5% loss on every link, 20% on one (root)"
	@echo "make bench-controller  passing-ctl at scale: 1,024 hosts x 8 GPUs, 36 switches, 256 jobs"
	@echo "                   (MAX_JOBS=N jobs per switch, WINDOW=slots per job; JSON in build/controller-scale)"
	@echo "make sim           simulate every strategy on SimGrid (leafspine, 20 Mbit/s): CSV, plots in build/sim"
	@echo "make sim-validate  the simulator against the latest make bench (docs/simulation.md)"
	@echo "make sim-study     1,024 hosts x 1-8 GPUs, 100 MB and 1 GB, oversubscription, concurrent jobs (~25 min)"
	@echo "make run-topology  Mininet + switches + controller + a default job, then the CLI"
	@echo "                   (TOPO=star|leafspine, TARGET=auto|bmv2|model, WINDOW=slots)"
	@echo "make stop          clean up after a run: Mininet, switch processes, namespaces"
	@echo "make docker-run-topology  the same on BMv2 inside the p4lang Docker images"

setup:
	./scripts/setup.sh

# passing.p4build compiles only when a P4 source is newer than the build or the build is for
# another K (as a make rule would); the topology runner calls the same step. Each K (PASSING_K)
# has its own build directory, $(BUILD)/k<K>.
build:
	@$(PY) -m passing.p4build --p4c $(P4C) --root $(BUILD)

# The open Tofino compiler (p4c-barefoot) is built outside the repository, as p4c is.
build-tofino:
	@$(PY) -m passing.tna_build --out $(BUILD)/tna-tofino2

# After changing p4src/: keep the committed P4Info (used by the model and the controller) in step.
update-p4info:
	@$(PY) -m passing.p4build --p4c $(P4C) --root $(BUILD) --update-p4info

# The install check: the switch's behaviour on every installed target (conformance), the units,
# the product's layers, and one all-reduce through Mininet on both shipped topologies. Everything
# else (controller and agent suites, the other Mininet scenarios, packaging) is in test-all.
# The other K's (a fresh interpreter each, about a minute) are not what is installed: test-all.
QUICK_TESTS = tests/unit tests/conformance tests/packaging/test_layers.py tests/sim \
	tests/integration/test_mininet.py::test_allreduce_on_every_host_is_correct \
	--deselect tests/unit/test_wide_k.py::test_k_sensitive_modules_pass_at_every_other_k
test:
	$(PY) -m pytest $(QUICK_TESTS)

test-all:
	$(PY) -m pytest

# K (values per packet) is a compile-time choice, PASSING_K (docs/protocol.md, "Choosing K");
# `make test` runs one K, and tests/unit/test_wide_k.py the K-sensitive unit tests at the others.
# This runs the switch-level suite, on both targets, at each other K too.
OTHER_K = $(shell $(PY) -c 'from passing import protocol as P; print(*(k for k in P.K_CHOICES if k != P.K))')
test-other-k:
	@for k in $(OTHER_K); do echo "== PASSING_K=$$k"; PASSING_K=$$k $(PY) -m pytest tests/conformance || exit 1; done

# The model switch takes PASSING packets through its compiled path (switch_model/fastpath.c) and
# tests/unit/test_fastpath.py holds it to the Python pipeline frame for frame; this runs the
# switch-level suite on the Python pipeline alone as well.
test-python-pipeline:
	PASSING_MODEL_PIPELINE=python $(PY) -m pytest tests/conformance -k "not bmv2"

# The host agent's window is compiled too (host_agent/window.c), held to the numpy window batch
# for batch by tests/host_agent/test_window_c.py; this runs the agent's tests on numpy alone.
test-numpy-window:
	PASSING_AGENT_WINDOW=python $(PY) -m pytest tests/host_agent

lint:
	$(PY) -m ruff check .

# The comparison of strategies (bench/sweep.py); needs root for Mininet.
bench:
	@[ "$$(id -u)" = 0 ] || { echo "make bench: Mininet needs root (sudo make bench)"; exit 2; }
	@./scripts/stop.sh >/dev/null  # whatever an interrupted run left behind
	@if command -v $(P4C) >/dev/null 2>&1; then $(MAKE) -s build; fi
	$(PY) -m bench.sweep --out $(BUILD)/bench --report docs/benchmarks.md

bench-quick:
	@[ "$$(id -u)" = 0 ] || { echo "make bench-quick: Mininet needs root"; exit 2; }
	@./scripts/stop.sh >/dev/null
	$(PY) -m bench.sweep --quick --out $(BUILD)/bench-quick --report $(BUILD)/bench-quick/benchmarks.md

bench-bmv2: build
	$(PY) -m bench.switch_pps --target bmv2 --json-out $(BUILD)/bench-bmv2.json

bench-model:
	@mkdir -p $(BUILD)
	$(PY) -m bench.switch_pps --target model --json-out $(BUILD)/bench-model.json

# Training with a straggler (bench/stragglers.py, docs/benchmarks.md "Stragglers"); root.
bench-stragglers:
	@[ "$$(id -u)" = 0 ] || { echo "make bench-stragglers: Mininet needs root"; exit 2; }
	@./scripts/stop.sh >/dev/null
	$(PY) -m bench.stragglers --out $(BUILD)/stragglers

# All-reduce under random loss (bench/loss.py, docs/benchmarks.md "Loss"); root.
bench-loss:
	@[ "$$(id -u)" = 0 ] || { echo "make bench-loss: Mininet needs root"; exit 2; }
	@./scripts/stop.sh >/dev/null
	@mkdir -p $(BUILD)
	$(PY) -m bench.loss --strategies passing,ring,hier-ring --json-out $(BUILD)/bench-loss.json

# The controller at scale (bench/controller_scale.py, docs/controller.md "At scale"): one model
# switch process with its P4Runtime server per switch, no ports; no root, no Mininet.
bench-controller:
	$(PY) -m bench.controller_scale --out $(BUILD)/controller-scale $(if $(MAX_JOBS),--max-jobs $(MAX_JOBS)) $(if $(WINDOW),--window $(WINDOW))

# The SimGrid simulator (sim/, docs/simulation.md): no root, no Mininet.
sim:
	$(PY) -m sim --topo topologies/leafspine.json --sizes 256K,1M,4M,16M --link-mbps 20 --gpus 2 --out $(BUILD)/sim

sim-validate:
	$(PY) -m sim validate --docs --out $(BUILD)/sim

sim-study:
	$(PY) -m sim study --docs --plots docs/simulation --out $(BUILD)/sim

TOPO ?= star
TARGET ?= auto
run-topology:
	@[ "$$(id -u)" = 0 ] || { echo "make run-topology: Mininet needs root (sudo make run-topology)"; exit 2; }
	@./scripts/stop.sh >/dev/null  # whatever an interrupted run left behind
	$(PY) -m topologies.run --topo topologies/$(TOPO).json --target $(TARGET) $(if $(WINDOW),--window $(WINDOW))

stop:
	./scripts/stop.sh

# The BMv2 setup for a user with Docker and no toolchain (see docker/Dockerfile).
docker-run-topology:
	docker build -f docker/Dockerfile -t passing .
	docker run --rm -it --privileged passing make run-topology TOPO=$(TOPO) TARGET=bmv2

clean:
	rm -rf $(BUILD)
