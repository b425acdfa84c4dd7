# Every target bootstraps .venv itself: a fresh machine needs only python3, pip, node/npm and make.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mcphost-installed
NODE_STAMP := tools/node_modules/.mcphost-installed

PACKAGES ?= $(SYSTEM_PACKAGES)

.PHONY: test-kernels demo-fleet demo-agents demo-model demo-host demo test test-slow test-loaded lint bench clean venv node system

# The fence's programs (docs/supervisor.md, "The fence"): bubblewrap, and socat for Claude Code's
# own sandbox inside it; and chromium, the headless browser the fleet page's test drives
# (tests/supervisor/test_supervise_page.py). Installed with apt-get where they are missing and we
# are root; elsewhere the line says what to install (the fence then refuses to start, naming the
# package; the page's browser test skips, saying so). `make test-kernels` also needs QEMU, and
# systemd (booted as the guest's init to run the contrib unit: tests/kernels/test_systemd_unit.py).
# Another apt holding the dpkg lock (unattended-upgrades on a fresh VM) is waited for, up to
# LOCK_WAIT seconds, saying so once (tools/dpkg_lock_wait.py; tests/core/test_install.py).
SYSTEM_PACKAGES := bubblewrap:bwrap socat:socat chromium:chromium
KERNEL_PACKAGES := qemu-system-x86:qemu-system-x86_64 systemd:systemctl
DPKG_LOCK ?= /var/lib/dpkg/lock-frontend
LOCK_WAIT ?= 300
APT_GET ?= apt-get
APT := $(APT_GET) -o DPkg::Lock::Timeout=$(LOCK_WAIT)
system:
	@for pair in $(PACKAGES); do pkg=$${pair%%:*}; bin=$${pair##*:}; \
	  command -v $$bin >/dev/null 2>&1 && continue; \
	  if [ "$$(id -u)" = 0 ] && command -v $(APT_GET) >/dev/null 2>&1; then \
	    python3 tools/dpkg_lock_wait.py --lock '$(DPKG_LOCK)' --wait '$(LOCK_WAIT)' || exit 1; \
	    echo "installing $$pkg (apt-get)" >&2; \
	    { $(APT) install -y -qq $$pkg >/dev/null 2>&1 || { $(APT) update -qq >/dev/null 2>&1 && $(APT) install -y -qq $$pkg >/dev/null; }; } || exit 1; \
	  else echo "$$bin not found: install the $$pkg package (the fence, the page's test or make test-kernels needs it)" >&2; fi; \
	done

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

# The node tools of tools/package.json: the MCP Inspector CLI (the interop test), and the Claude Code
# and Codex CLIs and their ACP adapters (the real-agent tests, `make demo-agents`); skipped without npm.
node: $(NODE_STAMP)

$(NODE_STAMP): tools/package.json
	@if command -v npm >/dev/null 2>&1; then \
	  cd tools && npm install --no-audit --no-fund --loglevel=error >/dev/null && touch node_modules/.mcphost-installed; \
	else echo "npm not found: the MCP Inspector interop test will be skipped, and make demo-agents cannot run" >&2; fi

# The main job in one command (~10 s): the devcenter, `mcphost supervise` with three stand-in
# agents in a tmux bundle, ctl status, a kill -9 and its restart, a relay send, a clean stop.
demo-fleet: $(STAMP) system
	@$(VENV)/bin/mcphost demo fleet

# Real agents (~15 s): the Claude Code and Codex CLIs and codex-acp, installed from npm by
# `make node` (tools/package.json pins them), in a fleet under `mcphost supervise` against the
# model stand-in and the devcenter, with their own sandboxes and approvals. One agent calls its
# center tools and relays to a peer, a peer's permission waits for its `choose`; nothing is left.
demo-agents: $(STAMP) node system
	@$(VENV)/bin/mcphost demo agents

# The model stand-in alone, for your own fleet: prints the env lines to paste; Ctrl-C stops it.
demo-model: $(STAMP)
	@$(VENV)/bin/mcphost demo model

# The standalone host (~5 s): a real MCP client drives `mcphost host` against the devcenter.
demo-host: $(STAMP)
	@$(VENV)/bin/mcphost demo host

# Both, the fleet first: together well under a minute.
demo: demo-fleet demo-host

# ruff, mypy, and the import rules (import-linter's contracts in pyproject.toml: the floors and
# every "must never import" a module docstring states; a forbidden import fails `make test`).
lint: $(STAMP)
	@$(VENV)/bin/ruff check mcphost configgen tests bench tools/loaded_runs.py tools/dpkg_lock_wait.py
	@$(VENV)/bin/ruff format --check mcphost configgen tests bench tools/loaded_runs.py tools/dpkg_lock_wait.py
	@$(VENV)/bin/mypy
	@out=$$($(VENV)/bin/lint-imports --no-cache --no-logo 2>&1) || { echo "$$out"; exit 1; }

# The suites start hundreds of Python processes of this checkout (supervisors, ctl, hosts,
# pumps, each xdist worker's collection): compiling its modules again in each cost more CPU than
# many of the tests. So they keep bytecode, even where the environment says not to write it
# (PYTHONDONTWRITEBYTECODE), in a tree of its own under .venv: the checkout stays clean.
BYTECODE := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(abspath $(VENV))/pycache

# The suite to run before every commit: lint, then pytest in parallel without the `slow` and
# `deep` tests (tests/README.md says which run where).
test: $(STAMP) node system lint
	@$(BYTECODE) $(PY) -m pytest

# The rest of the suite: the `deep` files (each marks itself: pytestmark), the long load and
# payload tests, and the `thorough` tests again at their full example counts (tests/thorough.py).
# CI runs it after `make test`.
test-slow: $(STAMP) node system
	@$(BYTECODE) MCPHOST_TEST_DEPTH=full $(PY) -m pytest -m '(slow or thorough or deep) and not kernels'

# The fence's and the limits' black-box tests on the kernels workers run (tests/kernels/): each
# Debian release's own kernel (11: 5.10, 12: 6.1, 13: 6.12) booted under QEMU over this machine's
# files, with cgroup v2 (tests/kernelvm.py; kernels cached in ~/.cache/mcphost/kernels), and the
# contrib systemd unit under this machine's systemd booted as init on Debian 12's kernel. CI runs it
# after test-slow; 10 to 13 minutes a kernel under QEMU's software emulation. The guests run with
# this environment, so they read the bytecode the suites kept (BYTECODE) instead of compiling
# every module again in each process at a quarter of the speed.
test-kernels: $(STAMP) node system
	@$(MAKE) --no-print-directory system PACKAGES='$(KERNEL_PACKAGES)'
	@$(BYTECODE) $(PY) -m pytest -m kernels -n 0 tests/kernels

# The determinism check: the pytest run of `make test`, RUNS times in a row, while one CPU burner
# per CPU spins (tools/loaded_runs.py). Not part of CI: it takes several suite runs.
RUNS ?= 5
test-loaded: $(STAMP) node
	@$(PY) tools/loaded_runs.py --runs $(RUNS)

bench: $(STAMP) system
	@$(PY) -m pip install -q --disable-pip-version-check -e '.[test,bench]'
	@$(PY) -m bench

clean:
	rm -rf $(VENV) tools/node_modules .mypy_cache .ruff_cache
