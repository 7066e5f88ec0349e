"""The model's own tokenizer: a Hugging Face `tokenizer.json` read through `tokenizers`.

`data.tokenizer_path` names a `tokenizer.json`, or a folder holding one; a
`tokenizer_config.json` beside it (optional) gives the special tokens and the chat template,
as transformers reads them:

- BOS / EOS: its `bos_token` / `eos_token` (a string, or an AddedToken dict with `content`),
  looked up in the tokenizer's vocabulary. Without them: the tokens the tokenizer's
  post-processor wraps a text in (`<|begin_of_text|> $A`), then the usual names among its
  special tokens. A tokenizer with no EOS is refused: packed documents need one between them.
- Whether a document starts with BOS: `add_bos_token` when the config says; otherwise
  whether the post-processor adds BOS; otherwise not (Qwen has no BOS at all).
- The chat template: the config's `chat_template` (a string, or a list of named templates:
  the one named `default`), else a `chat_template.jinja` file beside the tokenizer.

Text is encoded without the post-processor's specials (`add_special_tokens=False`): the
loaders place BOS and EOS themselves (packing.py), and a chat template writes its own.
Truncation and padding stored in the file are switched off: rows are cut by the loader.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from titan_core.config.loader import ConfigError

_BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|bos|>", "<|startoftext|>", "[CLS]")
_EOS_NAMES = ("<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|endoftext|>", "[SEP]")
"""Names of BOS / EOS among a tokenizer's special tokens when its config does not say (most common first)."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"tokenizer config '{path}' cannot be read as JSON: {e}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"tokenizer config '{path}' is not a JSON object")
    return config


def locate(path: str) -> tuple[Path, Path | None]:
    """(tokenizer.json, tokenizer_config.json or None) for `data.tokenizer_path`."""
    if not path:
        raise ConfigError("data.tokenizer = 'hf' needs data.tokenizer_path: a tokenizer.json or a folder holding one")
    p = Path(path).expanduser()
    if p.is_dir():
        file = p / "tokenizer.json"
        if not file.is_file():
            raise ConfigError(f"tokenizer file '{file}' does not exist (data.tokenizer_path is a folder without it)")
    elif p.is_file():
        file = p
    else:
        raise ConfigError(f"tokenizer file '{p}' does not exist (data.tokenizer_path)")
    config = file.parent / "tokenizer_config.json"
    return file, config if config.is_file() else None


def _chat_template(config: dict[str, Any], folder: Path) -> str | None:
    tpl = config.get("chat_template")
    if isinstance(tpl, list):  # several named templates: transformers' default is the one named "default"
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    if isinstance(tpl, str) and tpl:
        return tpl
    side = folder / "chat_template.jinja"  # newer save_pretrained writes the template to its own file
    return side.read_text(encoding="utf-8") if side.is_file() else None


class HfTokenizer:
    """A `tokenizers.Tokenizer` from a tokenizer.json with the surface the loaders use
    (`encode`, `encode_batch`, `decode`, `bos_id`, `eos_id`, `add_bos`, `vocab_size`)."""

    from_cache = False  # nothing trained here; kept for the surface the BPE tokenizer has

    def __init__(self, file: Path, config_path: Path | None):
        from tokenizers import Tokenizer  # lazy: the Rust extension loads only when an hf tokenizer is asked for

        self.path = file
        self.config_path = config_path
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as e:  # the Rust side raises plain Exceptions for a bad file
            raise ConfigError(f"tokenizer file '{file}' cannot be read by the tokenizers library: {e}") from None
        self._tok.no_truncation()
        self._tok.no_padding()
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        config = _read_config(config_path) if config_path else {}
        wrapped = self._post_processor_specials()
        self.bos_token, self.bos_id = self._special(config, "bos_token", wrapped[0], _BOS_NAMES)
        self.eos_token, self.eos_id = self._special(config, "eos_token", wrapped[1], _EOS_NAMES)
        if self.eos_id is None:
            raise ConfigError(
                f"tokenizer '{file}' has no EOS token: its tokenizer_config.json names no eos_token and it has none "
                f"of {', '.join(_EOS_NAMES)}; packed documents need an EOS between them"
            )
        add_bos = config.get("add_bos_token")
        self.add_bos = self.bos_id is not None and (bool(add_bos) if add_bos is not None else wrapped[0] is not None)
        self.chat_template = _chat_template(config, file.parent)
        self.special_tokens = {
            k: t for k in ("bos_token", "eos_token", "unk_token", "pad_token") if (t := _token_text(config.get(k)))
        }
        self.special_tokens.setdefault("eos_token", self.eos_token)
        if self.bos_token:
            self.special_tokens.setdefault("bos_token", self.bos_token)
        self.key = hashlib.sha256(file.read_bytes() + json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
        """Digest of tokenizer.json and its config: a resume must tokenize the same way."""

    def _post_processor_specials(self) -> tuple[str | None, str | None]:
        """The tokens the post-processor puts before and after a text (Llama 3: BOS before)."""
        plain = self._tok.encode("a", add_special_tokens=False).ids
        full = self._tok.encode("a", add_special_tokens=True).ids
        if not plain or len(full) <= len(plain):
            return None, None
        at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), None)
        if at is None:
            return None, None
        before, after = full[:at], full[at + len(plain) :]
        return (
            self._tok.id_to_token(before[0]) if before else None,
            self._tok.id_to_token(after[-1]) if after else None,
        )

    def _special(self, config, key: str, wrapped: str | None, names: tuple[str, ...]) -> tuple[str | None, int | None]:
        """(text, id) of a special token: the config's, else the post-processor's, else a usual name."""
        if key in config:
            text = _token_text(config[key])
            if text is None:  # written as null: the model has none (Qwen's bos_token)
                return None, None
            tid = self._tok.token_to_id(text)
            if tid is None:
                raise ConfigError(
                    f"tokenizer config '{self.config_path}': its {key} '{text}' is not a token of '{self.path}'"
                )
            return text, tid
        if wrapped is not None:
            return wrapped, self._tok.token_to_id(wrapped)
        specials = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        for name in names:
            if name in specials:
                return name, self._tok.token_to_id(name)
        return None, None

    # ---- encoding --------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and each token's (start, end) character span in `text`."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return enc.ids, enc.offsets

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_hf_tokenizer(path: str, *, model_vocab_size: int) -> HfTokenizer:
    """The tokenizer at `data.tokenizer_path`, refused when its vocabulary exceeds the model's."""
    file, config = locate(path)
    tok = HfTokenizer(file, config)
    if tok.vocab_size > model_vocab_size:
        raise ConfigError(
            f"tokenizer '{file}' has {tok.vocab_size} tokens (added tokens included) but the model's vocab_size is "
            f"{model_vocab_size}: its ids would index past the embedding; use the model's own tokenizer"
        )
    return tok
