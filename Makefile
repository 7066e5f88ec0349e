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

# docs/COMPATIBILITY.md: the compat table (kept out of `make test`). Each architecture climbs every rung
# with the ladder engine: ~2-5 min for one that passes them all on 2 CPU cores (simple_fsdp's three
# 2-rank runs are the most of it), seconds for one that stops at eager.
# The list: the architectures the README and the issue name, three MoE and a hybrid, then a systematic
# sample (every 10th causal-LM model_type transformers 5.24 ships, in sorted order) so the table is not
# only the ones known to work. COMPAT_TYPES= (empty) probes all 196: many hours on a CPU.
# Both tables are rewritten after every architecture: after a Ctrl-C (or a crash), `make compat
# COMPAT_RESUME=1` keeps the rows COMPAT_RESULTS holds and probes only the others.
COMPAT_TYPES ?= llama qwen3 qwen3_moe olmo2 gemma2 granite mistral qwen2 phi3 mixtral gpt2 gemma3_text qwen2_moe olmoe jamba \
	afmoe beam blt data2vec-text dots3_note falcon gemma3n glm4 gpt_neox_japanese hrm_text iquestcoder lfm3 mellum mllama \
	nemotron_h phi qwen3_5_moe roberta stablelm xlstm
COMPAT_RESULTS ?= docs/COMPATIBILITY.json
compat: $(STAMP)
	$(VENV)/bin/onboard compat $(COMPAT_TYPES) --markdown docs/COMPATIBILITY.md --results $(COMPAT_RESULTS) $(if $(COMPAT_RESUME),--resume)

clean:
	rm -rf $(VENV) demo-run .pytest_cache
