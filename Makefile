# The two commands of the README. Both create .venv when missing and install pinned deps.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export TORCH_DEVICE_BACKEND_AUTOLOAD := 0
export HF_HUB_OFFLINE := 1

.PHONY: demo test install clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q pip==26.3
	# torch first, CPU build from its own pin, so nothing later pulls a multi-GB CUDA wheel
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[hf,jax,dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/onboard demo --dir demo-run

test: $(STAMP)
	$(PY) -m pytest -q -x --durations=15

clean:
	rm -rf $(VENV) demo-run .pytest_cache
