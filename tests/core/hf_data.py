"""A tiny Hugging Face tokenizer folder and data files, written by the tests that need them.

The tokenizer is a WordLevel over a few sentences' words (whitespace pre-tokenizer, so ids
map to words one to one and a test can read a row back), with the special tokens a chat
template uses; tokenizer_config.json names BOS / EOS, asks for BOS, and holds a ChatML-like
template that puts BOS first.
"""

from __future__ import annotations

import json
from pathlib import Path

SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a second document about cats and dogs",
    "hello world this is a test",
    "what is two plus two",
    "two plus two is four",
    "tell me a joke about a cat",
    "why did the cat sit on the computer to keep an eye on the mouse",
]
SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
WORDS = sorted({w for s in SENTENCES for w in s.split()} | {f"doc{i}" for i in range(400)})
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def write_tokenizer(folder: Path, *, extra_words: int = 0, config: dict | None = None) -> Path:
    """tokenizer.json (+ tokenizer_config.json unless `config` is {}) in `folder`; returns the folder.
    `extra_words` adds that many more words (a vocabulary bigger than a small model's)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    words = WORDS + [f"extra{i}" for i in range(extra_words)]
    vocab = {t: i for i, t in enumerate(SPECIALS + words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(SPECIALS)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    if config is None:
        config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "chat_template": CHAT_TEMPLATE}
    if config:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def vocab_size() -> int:
    return len(SPECIALS) + len(WORDS)


def doc_text(i: int, words: int = 6) -> str:
    """Document i: its marker word `doc<i>` then words from the sentences (so rows can be traced back)."""
    pool = " ".join(SENTENCES).split()
    return " ".join([f"doc{i}"] + [pool[(i * 7 + k) % len(pool)] for k in range(words + i % 5)])


def write_jsonl(path: Path, rows: list, *, raw_lines: dict[int, str] | None = None) -> Path:
    """One JSON value per line; `raw_lines` {index: text} puts a line as is (a broken one) at that index."""
    lines = [json.dumps(r) for r in rows]
    for i, text in sorted((raw_lines or {}).items()):
        lines.insert(i, text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def conversation(i: int) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "hello world"},
            {"role": "user", "content": f"doc{i} what is two plus two"},
            {"role": "assistant", "content": "two plus two is four"},
            {"role": "user", "content": "tell me a joke about a cat"},
            {"role": "assistant", "content": f"doc{i + 1} why did the cat sit on the computer"},
        ][: 3 + 2 * (i % 2)]
    }
