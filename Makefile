# trainfleet: the two commands of the README, and the set-up they need.
#   make demo   venv + lab packages, a 3-node lab, the main job twice (the 2nd changes nothing)
#               with the launch stack pinned, then drift and the preflight
#   make test   venv, the linters (ruff, import contracts), lab packages, then the whole suite
#               (unit, fixture and lab tests)
#   make bench  venv + lab packages, then the benchmark on labs of 1..16 nodes (docs/benchmark.*)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LAB_NODES ?= 3
# Debian packages the controller needs to run the lab (never installed into a running lab:
# the host's / is the lab's lower layer).
# chromium: the HTML reports are tested in a real headless browser (tests/unit/test_html_report.py)
HOST_PACKAGES := iproute2 openssh-server openssh-client tini python3-venv chromium
# Debian packages lab tests install inside nodes, pre-downloaded into the host's apt cache
# because nodes have no network.
NODE_PACKAGES := pdsh nftables openmpi-bin gcc-11 g++-11 sudo
# PyTorch and its dependencies for the nodes' venvs, as an air-gapped cluster gets them:
# a wheelhouse (nodes read it through the host's / below them). torch 2.13.0 is the CPU
# build this kind of machine serves from its own disk.
WHEELHOUSE := /var/cache/trainfleet/wheelhouse
NODE_TORCH := torch==2.13.0
# The launch packages beside torch (lab/lab_stack.py pins them). DeepSpeed and ColossalAI are
# sdists: built once into pure-Python wheels, without compiled ops (DS_BUILD_OPS=0,
# BUILD_EXT=0). ColossalAI's requirements (torch<=2.5.1, ...) are not downloaded: the nodes
# install it without them, beside what its runner imports (click, fabric; numpy, psutil and
# packaging come with DeepSpeed).
NODE_PYTHON := accelerate==1.15.0 deepspeed==0.19.8 click==8.5.1 fabric==3.2.3
DEEPSPEED := deepspeed==0.19.8
COLOSSALAI := colossalai==0.5.0

.PHONY: venv host-deps demo lint test unit bench lab-down clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	HOROVOD_SKIP_COMPILE=1 $(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

host-deps: $(VENV)/.host-deps

$(VENV)/.host-deps: Makefile $(VENV)/.installed
	@mkdir -p $(VENV)
	@if [ "$$(id -u)" != 0 ]; then echo "the lab needs root: run make as root"; exit 1; fi
	@missing=""; for p in $(HOST_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi
	@apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --download-only $(NODE_PACKAGES) >/dev/null
	@mkdir -p $(WHEELHOUSE) && $(VENV)/bin/pip download --quiet --dest $(WHEELHOUSE) '$(NODE_TORCH)'
	@ls $(WHEELHOUSE)/deepspeed-0.19.8-*.whl >/dev/null 2>&1 || \
	  DS_BUILD_OPS=0 $(VENV)/bin/pip wheel --quiet --no-deps --wheel-dir $(WHEELHOUSE) '$(DEEPSPEED)'
	@ls $(WHEELHOUSE)/colossalai-0.5.0-*.whl >/dev/null 2>&1 || \
	  BUILD_EXT=0 $(VENV)/bin/pip wheel --quiet --no-deps --wheel-dir $(WHEELHOUSE) '$(COLOSSALAI)'
	@$(VENV)/bin/pip download --quiet --dest $(WHEELHOUSE) --find-links $(WHEELHOUSE) '$(NODE_TORCH)' $(NODE_PYTHON)
	touch $@

demo: venv host-deps
	@$(PY) -m lab status --quiet || $(PY) -m lab up $(LAB_NODES)
	@echo "--> Provision: names, SSH mesh, pdsh, NCCL environment, launchers; torch, accelerate, DeepSpeed, ColossalAI, OpenMPI pinned"
	$(VENV)/bin/pyinfra -y inventories/lab_launch.py deploy/cluster.py
	@echo "--> Second run: a converged cluster must report no change"
	$(VENV)/bin/pyinfra -y inventories/lab_launch.py deploy/cluster.py
	@echo "--> Drift: every node against the spec and the others (one command per node)"
	$(VENV)/bin/pyinfra -y inventories/lab_launch.py deploy/drift.py
	@echo "--> Preflight: names, ports, the SSH mesh and a real torch.distributed collective"
	$(VENV)/bin/pyinfra -y inventories/lab_launch.py deploy/preflight.py
	@echo
	@echo "The lab is up and can train. Start the smoke job (two DDP steps, checked) with any launcher:"
	@echo "  on node1:         $(PY) -m lab ssh node1 -- /etc/trainfleet/launch/deepspeed.sh /etc/trainfleet/launch/smoke_train.py"
	@echo "                    $(PY) -m lab ssh node1 -- /etc/trainfleet/launch/colossalai.sh /etc/trainfleet/launch/smoke_train.py"
	@echo "                    $(PY) -m lab ssh node1 -- /etc/trainfleet/launch/mpirun.sh /opt/trainfleet/venv/bin/python \\"
	@echo "                        /etc/trainfleet/launch/smoke_train.py --master-addr 198.18.0.11 --master-port 29500"
	@echo "  on every node:    $(PY) -m lab ssh nodeN -- /etc/trainfleet/launch/torchrun.sh /etc/trainfleet/launch/smoke_train.py"
	@echo "                    $(PY) -m lab ssh nodeN -- /etc/trainfleet/launch/accelerate.sh /etc/trainfleet/launch/smoke_train.py"
	@echo "Look inside:        $(PY) -m lab ssh node2 -- cat /etc/trainfleet/launch/README"
	@echo "Tear it down:       $(PY) -m lab down"

# Fails fast, before the lab's packages are fetched: style (ruff, 100 columns), formatting, and the
# layers of ../shared/ARCHITECTURE.md as import contracts (pyproject.toml's [tool.importlinter]).
lint: venv
	@$(VENV)/bin/ruff check . || { echo "make: ruff check failed (above)"; exit 1; }
	@$(VENV)/bin/ruff format --check . || { echo "make: not formatted (above): run $(VENV)/bin/ruff format"; exit 1; }
	@$(VENV)/bin/lint-imports || { echo "make: an import breaks a layer contract (above)"; exit 1; }
	@$(VENV)/bin/mypy || { echo "make: the core does not type-check (above; [tool.mypy] in pyproject.toml)"; exit 1; }

test: venv lint host-deps
	@$(PY) -m lab down >/dev/null  # the tests bring up (and take down) their own lab
	$(PY) -m tests.run_suite  # shards at once (unit, and each lab shard with its own lab); prints the slowest

bench: venv host-deps
	$(VENV)/bin/pip install --quiet -e '.[test,bench]'
	$(PY) -m bench $(BENCH_ARGS)  # brings up (and takes down) its own labs: none may be up
	$(PY) -m bench.report_render  # what a report costs to render at 16, 256 and 1,024 nodes

unit: venv
	$(PY) -m pytest -q -m 'not lab'

lab-down: venv
	$(PY) -m lab down

clean: lab-down
	rm -rf $(VENV)
