# The two commands of the README. Both create .venv when missing and install pinned deps.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export TORCH_DEVICE_BACKEND_AUTOLOAD := 0
export HF_HUB_OFFLINE := 1

.PHONY: demo test install clean compat

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q pip==26.3
	# torch first, CPU build from its own pin, so nothing later pulls a multi-GB CUDA wheel
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[hf,jax,dev,diffusers,tb,float8]'
	@touch $(STAMP)

install: $(STAMP)

# --force: a second `make demo` keeps the first run's folders as <name>.backup-<time> in demo-run/
demo: $(STAMP)
	$(VENV)/bin/onboard demo --dir demo-run --force

test: $(STAMP)
	$(PY) -m pytest -q -x -n 2 --dist loadscope --no-loadscope-reorder --durations=15

# docs/COMPATIBILITY.md: the compat table (kept out of `make test`): every causal-LM model_type
# transformers ships (196 in 5.24), each climbing every rung with the ladder engine on a tiny config,
# COMPAT_JOBS probes side by side. Hours on 2 CPU cores: ~2-5 min for one that passes every rung
# (simple_fsdp's three 2-rank runs are the most of it), seconds for one that stops at eager.
# Both tables are rewritten after every architecture: after a Ctrl-C (or a crash, or a session's end),
# `make compat COMPAT_RESUME=1` keeps the rows COMPAT_RESULTS holds and probes only the others.
# COMPAT_TYPES="llama qwen3" probes only those. A sweep does not replace the tables it finds without
# COMPAT_RESUME=1 (go on from them) or COMPAT_FORCE=1 (start over; the old files kept as <name>.backup-<time>).
COMPAT_TYPES ?=
COMPAT_JOBS ?= 2
COMPAT_RESULTS ?= docs/COMPATIBILITY.json
compat: $(STAMP)
	$(VENV)/bin/onboard compat $(COMPAT_TYPES) --jobs $(COMPAT_JOBS) --markdown docs/COMPATIBILITY.md \
		--results $(COMPAT_RESULTS) $(if $(COMPAT_RESUME),--resume) $(if $(COMPAT_FORCE),--force)

clean:
	rm -rf $(VENV) demo-run .pytest_cache
