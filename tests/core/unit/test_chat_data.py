"""data.format = "chat": conversations through the chat template, trained on assistant tokens only."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hf_data import conversation, write_jsonl, write_tokenizer

from titan_core.config import ConfigError, JobConfig, load_config
from titan_core.data import build_data_loader, load_hf_tokenizer
from titan_core.data.base import IGNORE_INDEX

VOCAB = 512
MODEL = (
    "--model.overrides={n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_hidden_dim = 128, vocab_size = 512}"
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer")


def _cfg(path, tok_dir, *, batch_size=2, seq_len=48, **data) -> JobConfig:
    cfg = JobConfig()
    cfg.training.batch_size, cfg.training.seq_len = batch_size, seq_len
    cfg.data.source, cfg.data.path, cfg.data.format = "dataset", str(path), "chat"
    cfg.data.tokenizer, cfg.data.tokenizer_path = "hf", str(tok_dir)
    cfg.data.max_epochs = 0  # a few conversations read for a batch or two, not for 30 steps (test_data_coverage.py)
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


def _assistant_ids(tok, conv: dict) -> list[list[int]]:
    """By hand: each assistant turn as the template writes it, `<|assistant|> content <|end|>`."""
    return [tok.encode(f"<|assistant|> {m['content']} <|end|>") for m in conv["messages"] if m["role"] == "assistant"]


def test_labels_are_the_assistant_turns_only(tmp_path, tok_dir):
    convs = [conversation(i) for i in range(4)]
    path = write_jsonl(tmp_path / "chat.jsonl", convs)
    tok = load_hf_tokenizer(str(tok_dir), model_vocab_size=VOCAB)
    loader = build_data_loader(_cfg(path, tok_dir, pack_documents=False), vocab_size=VOCAB)
    batches = [next(loader) for _ in range(2)]
    rows = [(b.tokens[r], b.labels[r]) for b in batches for r in range(2)]
    for conv, (tokens, labels) in zip(convs, rows):
        assert tokens[0] == tok.bos_id and tokens[1] == tok.encode("<|system|>")[0]
        assert [t for t in labels.tolist() if t != IGNORE_INDEX] == [
            i for turn in _assistant_ids(tok, conv) for i in turn
        ]
        assert (labels[-3:] == IGNORE_INDEX).all()  # padding past the conversation
    # packed: the same targets, conversations one after another with their own segments and positions
    packed = next(build_data_loader(_cfg(path, tok_dir, seq_len=64), vocab_size=VOCAB))
    targets = [t for t in packed.labels.flatten().tolist() if t != IGNORE_INDEX]
    want = [i for conv in convs for turn in _assistant_ids(tok, conv) for i in turn]
    assert targets == want[: len(targets)] and len(targets) > 12
    assert packed.segment_ids[0].max() >= 1 and (packed.positions[0] == 0).sum() >= 2


def test_assistant_only_loss_is_the_masked_mean_by_hand(tmp_path, tok_dir):
    """Step 1's loss of a 2-conversation batch equals cross-entropy over the assistant tokens alone,
    from the model's logits masked by hand (the target sits between <|assistant|> and <|end|>)."""
    from titan_core.training.trainer import Trainer

    path = write_jsonl(tmp_path / "chat.jsonl", [conversation(0), conversation(1)])
    cfg = load_config(None, [
        MODEL, "--training.batch_size=2", "--training.seq_len=48", "--training.steps=1", "--training.deterministic",
        "--device.type=cpu", "--device.threads=1", "--metrics.rich=false", f"--metrics.output_dir={tmp_path / 'out'}",
        "--data.source=dataset", f"--data.path={path}", "--data.format=chat", "--data.pack_documents=false",
        "--data.tokenizer=hf", f"--data.tokenizer_path={tok_dir}",
    ])  # fmt: skip
    trainer = Trainer(cfg, quiet=True)
    batch = trainer.data.batch_at(0)
    tok = trainer.data.tokenizer
    start, end = tok.encode("<|assistant|>")[0], tok.encode("<|end|>")[0]
    with torch.no_grad():
        logits = trainer.model(batch.tokens).float()
    terms, everything = [], []
    for r in range(2):
        ids = batch.tokens[r].tolist()
        inside = False
        for t in range(len(ids) - 1):
            nxt = ids[t + 1]
            inside = inside or nxt == start
            ce = F.cross_entropy(logits[r, t], torch.tensor(nxt))
            everything.append(ce)
            if inside:
                terms.append(ce)
            if nxt == end:
                inside = False
    by_hand = torch.stack(terms).mean().item()
    result = trainer.train()
    assert len(terms) == sum(len(turn) for c in (conversation(0), conversation(1)) for turn in _assistant_ids(tok, c))
    assert math.isclose(result.metrics[0]["loss"], by_hand, rel_tol=1e-6)
    assert not math.isclose(torch.stack(everything).mean().item(), by_hand, rel_tol=1e-3)  # the mask matters


def test_the_recipes_template_and_parquet_messages(tmp_path, tok_dir):
    import pyarrow as pa
    import pyarrow.parquet as pq

    convs = [conversation(i) for i in range(4)]
    (tmp_path / "p").mkdir()
    pq.write_table(pa.table({"messages": [c["messages"] for c in convs]}), tmp_path / "p" / "c.parquet")
    jsonl = write_jsonl(tmp_path / "c.jsonl", convs)
    want = next(build_data_loader(_cfg(jsonl, tok_dir), vocab_size=VOCAB))
    got = next(build_data_loader(_cfg(tmp_path / "p", tok_dir), vocab_size=VOCAB))
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.labels, want.labels)
    own = "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    batch = next(build_data_loader(_cfg(jsonl, tok_dir, chat_template=own), vocab_size=VOCAB))
    tok = load_hf_tokenizer(str(tok_dir), model_vocab_size=VOCAB)
    assert batch.tokens[0, 0] != tok.bos_id  # the recipe's template writes no BOS
    # the role word is no word of this vocabulary: it reads as <unk>, and is the assistant's first target
    assert [t for t in batch.labels[0].tolist() if t != IGNORE_INDEX][:7] == tok.encode(
        "assistant two plus two is four </s>"
    )


def test_bad_conversations_are_counted(tmp_path, tok_dir):
    good = [conversation(i) for i in range(3)]
    bad = [
        {"messages": "not a list"},
        {"messages": []},
        {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": "hello"}]},
        {"text": "no messages"},
    ]
    path = write_jsonl(tmp_path / "c.jsonl", good[:1] + bad + good[1:])
    # mostly bad on purpose: counted here, not refused (data.min_valid_fraction: test_data_coverage.py)
    loader = build_data_loader(_cfg(path, tok_dir, min_valid_fraction=0.0), vocab_size=VOCAB)
    next(loader)
    assert loader.report()["bad"] == {"non_string": 1, "empty": 1, "malformed": 1, "no_assistant": 1, "missing": 1}
    # a template that raises for a conversation, and one that rewrites earlier turns, skip it too
    strict = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}" + (
        "{% for m in messages %}{{ m['content'] }} </s> {% endfor %}"
    )
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [conversation(0), {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}],
    )
    loader = build_data_loader(_cfg(path, tok_dir, chat_template=strict), vocab_size=VOCAB)
    next(loader)
    assert loader.report()["bad"] == {"template_error": 1}
    rewrites = "{% for m in messages %}{% if loop.last %}last {% endif %}{{ m['content'] }} </s> {% endfor %}"
    loader = build_data_loader(_cfg(path, tok_dir, chat_template=rewrites, pack_documents=False), vocab_size=VOCAB)
    with pytest.raises(ConfigError, match="no usable document"):
        next(loader)
    assert loader.report()["bad"] == {"not_prefix_stable": 2}


def test_chat_settings_that_cannot_work_are_config_errors(tmp_path, tok_dir):
    path = write_jsonl(tmp_path / "c.jsonl", [conversation(0)])
    with pytest.raises(ConfigError, match="needs data.tokenizer = 'hf'"):
        build_data_loader(_cfg(path, tok_dir, tokenizer="byte"), vocab_size=VOCAB)
    bare = write_tokenizer(tmp_path / "bare", config={"eos_token": "</s>"})
    with pytest.raises(ConfigError, match="bare/tokenizer_config.json' has none"):
        build_data_loader(_cfg(path, bare), vocab_size=VOCAB)
    with pytest.raises(ConfigError, match="chat template of data.chat_template does not compile"):
        build_data_loader(_cfg(path, tok_dir, chat_template="{% for m in messages %}"), vocab_size=VOCAB)
    cfg = _cfg(path, tok_dir)
    cfg.data.source = "text"
    with pytest.raises(ConfigError, match="needs data.source = 'dataset'"):
        build_data_loader(cfg, vocab_size=VOCAB)
    (tmp_path / "t.txt").write_text("hello")
    with pytest.raises(ConfigError, match="reads a 'messages' column"):
        build_data_loader(_cfg(tmp_path / "t.txt", tok_dir), vocab_size=VOCAB)
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"text": "hello"}])
    with pytest.raises(ConfigError, match="reads the column 'messages': no row"):
        build_data_loader(_cfg(plain, tok_dir), vocab_size=VOCAB)
    (bare / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }} </s> {% endfor %}")
    assert next(build_data_loader(_cfg(path, bare, batch_size=1), vocab_size=VOCAB)).tokens.numel() == 48
