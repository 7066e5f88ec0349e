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
	$(PY) -m pip install -q -c constraints.txt -e '.[hf,jax,dev]'
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/onboard demo --dir demo-run

test: $(STAMP)
	$(PY) -m pytest -q -x --durations=15

# docs/COMPATIBILITY.md: the compat table (kept out of `make test`; ~40 s per architecture on 2 CPU cores).
# COMPAT_TYPES= (empty) probes every causal LM transformers ships: hours on a CPU.
COMPAT_TYPES ?= llama qwen3 qwen3_moe olmo2 gemma2 granite mistral qwen2 phi3 mixtral gpt2 gemma3_text qwen2_moe olmoe jamba
compat: $(STAMP)
	$(VENV)/bin/onboard compat $(COMPAT_TYPES) --markdown docs/COMPATIBILITY.md

clean:
	rm -rf $(VENV) demo-run .pytest_cache
