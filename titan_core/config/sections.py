"""The config tree: one keyword-only dataclass per section.

Each field carries an attribute docstring (the string literal under it); `describe()`
in `loader.py` reads them back for `--help`-style listings, so keep them one sentence.

A numeric field with a range is declared with `checked(default, RANGE)`: the range sits in
the field's metadata, the loader rejects a value outside it (one line naming `section.key`,
the value and the range; exit 2 from the entry points), and the field's docstring states the
same range in the same words (`str(RANGE)`, e.g. ">= 1"). NaN and infinity are outside every range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True)
class Range:
    """The values a numeric field accepts: above `lo` (or equal, unless `lo_open`), below
    `hi` when given (or equal, unless `hi_open`), or exactly one of `also` (`also_why` says what
    such a value means). The text and the test come from the same numbers, so they agree."""

    lo: float
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    also: tuple = ()
    also_why: str = ""

    def accepts(self, value: Any) -> bool:
        if value in self.also:
            return True
        if isinstance(value, float) and not math.isfinite(value):  # inf passes `>= lo` but is no learning rate
            return False
        try:
            ok = value > self.lo if self.lo_open else value >= self.lo
            if self.hi is not None:
                ok = ok and (value < self.hi if self.hi_open else value <= self.hi)
        except TypeError:  # None or a string set in code: no number at all
            return False
        return bool(ok)

    def __str__(self) -> str:
        if self.hi is None:
            text = f"{'>' if self.lo_open else '>='} {self.lo:g}"
        else:
            text = f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        if self.also:
            text += " or " + " or ".join(map(str, self.also)) + (f" ({self.also_why})" if self.also_why else "")
        return text


AT_LEAST_1 = Range(1)
NON_NEGATIVE = Range(0)
POSITIVE = Range(0, lo_open=True)
FRACTION = Range(0, 1)
DECAY_RATE = Range(0, 1, hi_open=True)
DEGREE = Range(1, also=(-1,), also_why="fill from the world size")
EPOCH_BOUND = Range(1, also=(0,), also_why="no bound")


def checked(default: Any, accepted: Range) -> Any:
    """A field whose values must lie in `accepted` (see the module docstring)."""
    return field(default=default, metadata={"range": accepted})


@dataclass(kw_only=True)
class Model:
    family: str = "llama3"
    """Model family: a folder under titan_core/models (llama3, qwen3, qwen3_moe, glimmer)."""
    flavor: str = "debugmodel"
    """Named size within the family (see its flavors.py)."""
    hf_config: str = ""
    """Path to a Hugging Face config.json (relative: to the recipe's folder); when set it defines the architecture."""
    overrides: dict = field(default_factory=dict)
    """Field overrides applied on top of the flavor's args, e.g. {n_layers = 2}."""
    module_file: str = ""
    """Path to a Python file (relative: to the recipe's folder) whose `build_model(args)` replaces the family's model class (ports)."""
    adapter_file: str = ""
    """Path to a Python file (relative: to the recipe's folder) whose HF adapter (`ADAPTER`, or module functions `args_from_hf`, `from_hf`, `to_hf`) replaces the family's for the architecture and export."""


@dataclass(kw_only=True)
class Training:
    steps: int = checked(30, AT_LEAST_1)
    """Number of optimizer steps to run (>= 1)."""
    batch_size: int = checked(8, AT_LEAST_1)
    """Sequences per micro-batch on each data-parallel rank (>= 1)."""
    seq_len: int = checked(256, AT_LEAST_1)
    """Tokens per sequence (>= 1)."""
    grad_accum: int = checked(1, AT_LEAST_1)
    """Micro-batches accumulated before each optimizer step (>= 1)."""
    max_norm: float = checked(1.0, NON_NEGATIVE)
    """Gradient clipping threshold on the global L2 norm (>= 0; 0 disables clipping)."""
    seed: int = 0
    """Seed for parameter init and synthetic data."""
    deterministic: bool = False
    """Use deterministic algorithms (bit-reproducible runs, may be slower)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of the parameters as the model reads them."""
    mixed_precision_param: Literal["float32", "bfloat16"] = "float32"
    """Dtype parameters are gathered in under data parallelism (master weights stay fp32)."""
    mixed_precision_reduce: Literal["float32", "bfloat16"] = "float32"
    """Dtype gradients are reduced in under data parallelism."""


@dataclass(kw_only=True)
class Data:
    source: Literal["synthetic", "text", "dataset"] = "synthetic"
    """synthetic: seeded random tokens; text: local .txt files; dataset: local JSONL/JSON/Parquet/text files through the `datasets` library."""
    path: str = ""
    """File or folder of .txt files (source = text), or a file, folder or glob of data files (source = dataset); relative: to the recipe's folder."""
    field: str = "text"
    """The column holding each document's text (source = dataset, format = text)."""
    format: Literal["text", "chat"] = "text"
    """text: documents packed to seq_len; chat: a `messages` column through the chat template, loss on assistant tokens only."""
    chat_template: str = ""
    """A Jinja chat template that replaces the tokenizer's own (format = chat); empty: the tokenizer's."""
    tokenizer: Literal["byte", "bpe", "hf"] = "byte"
    """byte: 256 byte ids + specials; bpe: a `tokenizers` BPE trained on `path` and cached; hf: the model's own tokenizer.json (`tokenizer_path`)."""
    tokenizer_path: str = ""
    """tokenizer = hf: a tokenizer.json, or a folder holding one (and tokenizer_config.json); relative: to the recipe's folder."""
    bpe_vocab_size: int = 2048
    """Vocabulary size of the locally trained BPE tokenizer."""
    cache_dir: str = ".cache/titan_core"
    """Where the trained tokenizer is cached."""
    pack_documents: bool = True
    """Pack documents into sequences and emit segment ids so attention stays within a document."""
    repeat_batch: bool = False
    """Train on the first micro-batch at every step (data the model can memorise: the loss must fall)."""
    min_valid_fraction: float = checked(0.5, FRACTION)
    """Refuse data whose usable rows are fewer than this share (in [0, 1]) of its non-blank rows, on the first rows before step 1 and on each rank's shard once read whole: mostly bad rows are a wrong file or data.field, not noise (0: never refuse)."""
    max_epochs: int = checked(100, EPOCH_BOUND)
    """Refuse a run whose planned steps need more passes over its data than this (>= 1 or 0 (no bound)): fine-tuning makes a few, a small SFT set tens; past 100 a model memorises its few documents, and the data is almost surely mostly missing (a path, a field, a filter)."""


@dataclass(kw_only=True)
class Optimizer:
    name: Literal["adamw"] = "adamw"
    """Optimizer; AdamW is the only one."""
    lr: float = checked(8e-4, NON_NEGATIVE)
    """Peak learning rate (>= 0)."""
    beta1: float = checked(0.9, DECAY_RATE)
    """AdamW first-moment decay (in [0, 1))."""
    beta2: float = checked(0.95, DECAY_RATE)
    """AdamW second-moment decay (in [0, 1))."""
    eps: float = checked(1e-8, NON_NEGATIVE)
    """AdamW epsilon (>= 0)."""
    weight_decay: float = checked(0.1, NON_NEGATIVE)
    """Decoupled weight decay (>= 0); biases, norms and embeddings are exempt."""


@dataclass(kw_only=True)
class LRScheduler:
    warmup_steps: int = checked(5, NON_NEGATIVE)
    """Linear warmup steps from near zero to the peak lr (>= 0)."""
    decay: Literal["cosine", "linear", "none"] = "cosine"
    """Shape of the decay after warmup."""
    min_lr_ratio: float = checked(0.1, FRACTION)
    """Final lr as a fraction of the peak (in [0, 1])."""


@dataclass(kw_only=True)
class Parallelism:
    data_parallel: Literal["simple_fsdp", "fsdp2", "none"] = "simple_fsdp"
    """simple_fsdp: sharded DTensor params gathered by a parametrization (also at world size 1); fsdp2: fully_shard; none: plain eager, one process."""
    dp_replicate: int = checked(1, DEGREE)
    """Replicate degree, >= 1 or -1 (fill from the world size): the HSDP outer dimension (dp_replicate > 1 with dp_shard > 1 is HSDP, with dp_shard = 1 pure replication)."""
    dp_shard: int = checked(-1, DEGREE)
    """Shard degree, >= 1 or -1 (fill from the world size); at most one degree fills."""
    tp: int = checked(1, DEGREE)
    """Tensor-parallel degree, >= 1 or -1 (fill from the world size); composed with simple_fsdp only, and the family needs a TP plan."""
    sequence_parallel: bool = False
    """With tp > 1, also split norms and the residual stream over the sequence across TP ranks."""
    ep: int = checked(1, AT_LEAST_1)
    """Expert-parallel degree (>= 1): experts are split over `ep` ranks carved from the dp_shard x cp ranks (it must divide their product); tokens reach their experts by all-to-all."""
    ep_capacity_factor: float = checked(0.0, NON_NEGATIVE)
    """Capacity factor (>= 0). 0: no token is dropped; > 0 (needs ep > 1): in each MoE layer each expert takes at most ceil(cf x tokens x top_k / n_experts) (token, expert) rows from each rank (cf x its even share of the rank's routed rows), the earliest tokens first; the rest are dropped (their expert output is zero) and counted per step in the metrics column moe_dropped_tokens."""
    cp: int = checked(1, AT_LEAST_1)
    """Context-parallel degree (>= 1): each sequence is split over `cp` ranks (load-balanced causal chunks); it must divide training.seq_len into 2 x cp chunks."""
    pp: int = checked(1, AT_LEAST_1)
    """Pipeline-parallel degree (>= 1): the layers are split into stages over `pp` ranks; microbatches come from training.grad_accum."""
    pp_schedule: Literal["1F1B", "interleaved1F1B", "gpipe"] = "1F1B"
    """Pipeline schedule (torch.distributed.pipelining); interleaved1F1B puts 2 stages on each rank."""
    pp_layers: list = field(default_factory=list)
    """Decoder layers per stage, in order (empty: split by layer count as evenly as possible)."""
    reshard_after_forward: bool = False
    """SimpleFSDP: gather each weight again in the backward instead of keeping the forward's gathered copy, so a
    rank holds one layer's gathered weights at a time, not the model's (one more all-gather per weight per
    step; eager only). FSDP2 reshards after forward by itself."""
    timeout_s: float = checked(300.0, POSITIVE)
    """Seconds (> 0) a collective may wait for the other ranks before it fails the run (a hung or dead rank)."""


@dataclass(kw_only=True)
class Compile:
    enable: bool = False
    """Compile each transformer block and the loss with torch.compile."""
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    """torch.compile backend."""
    fullgraph: bool = False
    """Fail on a graph break inside a block instead of splitting it (breaks are counted either way)."""


@dataclass(kw_only=True)
class GraphTrainer:
    enable: bool = False
    """Capture forward, loss, backward, clipping and AdamW as one FX graph and run it as one program."""
    compile: Literal["none", "inductor"] = "none"
    """none: run the captured graph as is (bit-identical to eager); inductor: compile it whole."""
    disable_passes: list = field(default_factory=list)
    """Graph passes to skip, by registry name (e.g. ["apply_recompute"])."""
    numerics_changing: bool = False
    """Also run the numerics-changing pass tier (e.g. bf16 matmuls); results are no longer bit-identical."""
    debug_passes: bool = False
    """Print op counts before and after each graph pass."""
    memory_policy: Literal["default", "full", "offload"] = "default"
    """default: save matmul outputs, recompute the rest; full: recompute all but block boundaries; offload: park saved values on the host."""
    scan_layers: bool = False
    """Trace identical decoder blocks once, as the body of a scan over stacked weights."""
    split: bool = False
    """Run forward and backward as two separately compiled programs, saved activations on the host between them."""


@dataclass(kw_only=True)
class ActivationCheckpoint:
    mode: Literal["none", "full", "selective"] = "none"
    """Activations recomputed in the backward instead of kept, per decoder block (eager and per-block compile;
    the Graph Trainer has graph_trainer.memory_policy): none keeps them all; full keeps only each block's
    inputs; selective: as `selective` says."""
    selective: Literal["op", "layer"] = "op"
    """With mode = selective. op: every block keeps the outputs of its matmuls, attention and collectives
    and recomputes the rest (norms, activations, RoPE); layer: every `layer_period`-th block (0, p, 2p, ...)
    recomputed whole, the others kept."""
    layer_period: int = checked(2, AT_LEAST_1)
    """With selective = layer: recompute one block in every `layer_period` (>= 1; 1 is the same as full)."""


@dataclass(kw_only=True)
class Kernels:
    loss: Literal["plain", "fused_ce"] = "plain"
    """Cross-entropy: plain materialises [tokens, vocab] logits; fused_ce computes loss and grads in token chunks."""
    ce_chunk: int = checked(1024, AT_LEAST_1)
    """Tokens per fused_ce chunk (>= 1); each chunk holds one [ce_chunk, vocab] fp32 buffer."""
    z_loss: float = checked(0.0, NON_NEGATIVE)
    """Weight of the z-loss (mean squared logsumexp of the logits) added to the cross-entropy (>= 0; 0 disables it)."""
    attention: Literal["sdpa", "naive", "tokamax", "splash", "flex"] = "sdpa"
    """Attention: naive is the reference; tokamax needs the [jax] extra; splash needs a TPU; flex cannot train on CPU."""
    moe: Literal["loop", "dense", "grouped_mm", "tokamax"] = "loop"
    """MoE experts: loop is the reference (syncs the host); dense is static-shape, for torch.compile and the
    Graph Trainer; grouped_mm uses torch._grouped_mm; tokamax uses ragged_dot via JAX."""
    float8: Literal["none", "tensorwise", "rowwise"] = "none"
    """float8 training of the linear layers through torchao (tensorwise or rowwise scaling); on CPU torchao's emulation."""
    swaps: list = field(default_factory=list)
    """Extra swaps by registry name, applied after the ones the fields above select."""


@dataclass(kw_only=True)
class Checkpoint:
    enable: bool = False
    """Save checkpoints during training."""
    folder: str = "checkpoints"
    """Folder (under metrics.output_dir when relative) holding step-N checkpoints."""
    interval: int = checked(10, NON_NEGATIVE)
    """Save every N steps and at the last step (>= 0; 0: only at the last step)."""
    resume: bool = True
    """Resume from the latest checkpoint in `folder` if one exists."""
    export_hf: str = ""
    """When set, write the final weights in save_pretrained layout (config.json, sharded safetensors and their index, the tokenizer) into this folder (relative: to the recipe's folder)."""
    export_shard_mb: int = checked(5000, AT_LEAST_1)
    """Largest safetensors shard of an export, in MB (>= 1)."""
    initial_hf: str = ""
    """A Hugging Face model folder (config.json + model.safetensors or its sharded index) whose weights the run starts from; a resume from the run's own checkpoint takes precedence (relative: to the recipe's folder)."""


@dataclass(kw_only=True)
class Lora:
    enable: bool = False
    """Train LoRA adapters (through the peft library) instead of the whole model: every base weight frozen,
    only the adapters and `modules_to_save` trainable and holding optimizer state (needs the [hf] extra)."""
    rank: int = checked(8, AT_LEAST_1)
    """Rank r of each adapter's A [r, in] and B [out, r] (>= 1)."""
    alpha: float = checked(16.0, POSITIVE)
    """LoRA alpha (> 0): the adapter's output is scaled by alpha / rank."""
    dropout: float = checked(0.0, DECAY_RATE)
    """Dropout on the adapter's input (in [0, 1)); 0: none, and the step stays deterministic."""
    target_modules: list = field(default_factory=lambda: ["q_proj", "v_proj"])
    """Modules given adapters, by their HF module names as peft matches them (a name or a dotted suffix:
    "q_proj", "self_attn.o_proj", "model.layers.0.mlp.down_proj"); the family's adapter maps them to this model's layers."""
    modules_to_save: list = field(default_factory=list)
    """Modules trained whole beside the adapters and exported with them, by HF module name (e.g. ["lm_head"])."""
    merged_export: bool = False
    """checkpoint.export_hf writes the merged full model (today's export) instead of the PEFT adapter
    (adapter_model.safetensors + adapter_config.json)."""


@dataclass(kw_only=True)
class Metrics:
    output_dir: str = "runs/default"
    """Folder for metrics.jsonl, checkpoints and traces (relative: to the recipe's folder; the default, and an override, to the current directory)."""
    log_freq: int = checked(1, AT_LEAST_1)
    """Print a metrics row every N steps (>= 1; metrics.jsonl gets every step)."""
    rich: bool = True
    """Print metrics as a rich table (off: plain lines)."""
    tensorboard: bool = False
    """Also write every logged scalar as TensorBoard events under output_dir/tensorboard (needs the tensorboard package)."""
    tensor_peak: bool = False
    """Count each step's tensors at the dispatcher (titan_core/memory/tensor_peak.py) and log `tensor_peak_bytes`:
    what this rank held in tensors at the step's peak (its parameters, gradients and optimizer state before the
    step, plus the most the step allocated at once). A CPU's resident set (`peak_mem_bytes`) also holds what the
    allocator keeps and the runtime's own memory; this is what the memory estimate counts. Slows each step; a
    Graph Trainer's first step (its capture) is not counted."""


@dataclass(kw_only=True)
class Validation:
    enable: bool = False
    """Compute a held-out loss (and perplexity) every `freq` steps, without gradients."""
    path: str = ""
    """The held-out data (as data.path; read with the data section's source, tokenizer and format); relative: to the recipe's folder."""
    freq: int = checked(100, AT_LEAST_1)
    """Validate every N steps and at the last step (>= 1)."""
    steps: int = checked(10, AT_LEAST_1)
    """Batches per validation (>= 1); fewer when the held-out set ends first."""


@dataclass(kw_only=True)
class Profiler:
    enable: bool = False
    """Record a torch.profiler trace."""
    start_step: int = checked(3, AT_LEAST_1)
    """First profiled step (>= 1)."""
    num_steps: int = checked(2, AT_LEAST_1)
    """Number of profiled steps (>= 1)."""
    folder: str = "traces"
    """Trace folder (under metrics.output_dir when relative)."""


@dataclass(kw_only=True)
class Device:
    type: Literal["auto", "cpu", "cuda", "tpu"] = "auto"
    """Target device; auto picks cuda when available, else cpu (never tpu)."""
    threads: int = checked(0, NON_NEGATIVE)
    """CPU intra-op threads (>= 0; 0 leaves torch's default)."""
    adapt_threads: bool = False
    """At start, run with fewer than `threads` intra-op threads when other processes hold some of the
    cores: as many as are free (measured over ~0.4 s, at least 1), said in one line. OpenMP threads that
    share a core with another process wait on each other at every parallel region (2 threads on a
    2-core machine with one core busy: 3.7x slower than 1). The count changes the order of matmul
    sums, so a run that must repeat another bit for bit leaves it off (the default)."""
    memory_budget_gib: float = checked(0.0, NON_NEGATIVE)
    """GiB one process may use (>= 0; 0 reads it from the device); a run whose memory estimate exceeds it is refused before it allocates."""


@dataclass(kw_only=True)
class Tpu:
    libtpu_init_flags: str = ""
    """Extra LIBTPU_INIT_ARGS passed to libtpu when device.type = tpu."""


@dataclass(kw_only=True)
class JobConfig:
    model: Model = field(default_factory=Model)
    training: Training = field(default_factory=Training)
    data: Data = field(default_factory=Data)
    optimizer: Optimizer = field(default_factory=Optimizer)
    lr_scheduler: LRScheduler = field(default_factory=LRScheduler)
    parallelism: Parallelism = field(default_factory=Parallelism)
    compile: Compile = field(default_factory=Compile)
    graph_trainer: GraphTrainer = field(default_factory=GraphTrainer)
    activation_checkpoint: ActivationCheckpoint = field(default_factory=ActivationCheckpoint)
    kernels: Kernels = field(default_factory=Kernels)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    lora: Lora = field(default_factory=Lora)
    metrics: Metrics = field(default_factory=Metrics)
    validation: Validation = field(default_factory=Validation)
    profiler: Profiler = field(default_factory=Profiler)
    device: Device = field(default_factory=Device)
    tpu: Tpu = field(default_factory=Tpu)
