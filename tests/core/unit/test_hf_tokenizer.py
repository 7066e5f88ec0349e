"""data.tokenizer = "hf": a tokenizer.json (+ tokenizer_config.json) through `tokenizers`."""

from __future__ import annotations

import json

import pytest
from hf_data import SPECIALS, vocab_size, write_tokenizer

from titan_core.config import ConfigError, JobConfig
from titan_core.data import build_data_loader, build_tokenizer, load_hf_tokenizer


def test_specials_and_bos_come_from_the_config(tmp_path):
    tok = load_hf_tokenizer(str(write_tokenizer(tmp_path / "t")), model_vocab_size=512)
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (SPECIALS.index("<s>"), SPECIALS.index("</s>"), True)
    assert tok.vocab_size == vocab_size()
    assert tok.chat_template and tok.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"}
    ids = tok.encode("the cat <|end|>")
    assert tok.decode(ids) == "the cat" and len(ids) == 3  # a special token in the text is one id, dropped by decode
    # the file itself, not its folder, names the same tokenizer
    assert load_hf_tokenizer(str(tmp_path / "t" / "tokenizer.json"), model_vocab_size=512).key == tok.key


def test_config_without_bos_and_an_eos_of_its_own(tmp_path):
    folder = write_tokenizer(tmp_path / "t", config={"bos_token": None, "eos_token": {"content": "<|end|>"}})
    tok = load_hf_tokenizer(str(folder), model_vocab_size=512)
    assert (tok.bos_id, tok.add_bos, tok.eos_id) == (None, False, SPECIALS.index("<|end|>"))


def test_without_a_config_the_specials_are_found_by_name_and_post_processor(tmp_path):
    from tokenizers import Tokenizer, processors

    folder = write_tokenizer(tmp_path / "plain", config={})
    tok = load_hf_tokenizer(str(folder), model_vocab_size=512)
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, False)  # <s> / </s> by name; nothing adds BOS
    assert tok.chat_template is None
    # a post-processor that wraps a text in <s> ... makes BOS a document's first token (Llama 3's way)
    t = Tokenizer.from_file(str(folder / "tokenizer.json"))
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    t.save(str(folder / "tokenizer.json"))
    assert load_hf_tokenizer(str(folder), model_vocab_size=512).add_bos


def test_text_source_reads_with_the_hf_tokenizer(tmp_path):
    folder = write_tokenizer(tmp_path / "t")
    (tmp_path / "c.txt").write_text("the quick brown fox\n\nhello world this is a test\n")
    cfg = JobConfig()
    cfg.training.batch_size, cfg.training.seq_len = 1, 8
    cfg.data.source, cfg.data.path, cfg.data.tokenizer, cfg.data.tokenizer_path = (
        "text",
        str(tmp_path / "c.txt"),
        "hf",
        str(folder),
    )
    batch = next(build_data_loader(cfg, vocab_size=512))
    tok = load_hf_tokenizer(str(folder), model_vocab_size=512)
    want = [tok.bos_id, *tok.encode("the quick brown fox"), tok.eos_id, tok.bos_id, *tok.encode("hello world")]
    assert batch.tokens[0].tolist() == want[:8]


def test_vocab_larger_than_the_model_is_refused_naming_the_file(tmp_path):
    folder = write_tokenizer(tmp_path / "big", extra_words=300)
    with pytest.raises(ConfigError, match=r"big/tokenizer.json' has \d+ tokens .* vocab_size is 512"):
        load_hf_tokenizer(str(folder), model_vocab_size=512)


def test_bad_files_are_config_errors_naming_them(tmp_path):
    with pytest.raises(ConfigError, match="nowhere/tokenizer.json' does not exist"):
        build_tokenizer("hf", model_vocab_size=512, tokenizer_path=str(tmp_path / "nowhere" / "tokenizer.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty/tokenizer.json' does not exist"):
        build_tokenizer("hf", model_vocab_size=512, tokenizer_path=str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="needs data.tokenizer_path"):
        build_tokenizer("hf", model_vocab_size=512)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="junk/tokenizer.json' cannot be read"):
        build_tokenizer("hf", model_vocab_size=512, tokenizer_path=str(tmp_path / "junk"))
    folder = write_tokenizer(tmp_path / "t", config={"eos_token": "<nope>"})
    with pytest.raises(ConfigError, match=r"t/tokenizer_config.json': its eos_token '<nope>' is not a token"):
        build_tokenizer("hf", model_vocab_size=512, tokenizer_path=str(folder))
    (folder / "tokenizer_config.json").write_text(json.dumps(["a list"]))
    with pytest.raises(ConfigError, match="tokenizer_config.json' is not a JSON object"):
        build_tokenizer("hf", model_vocab_size=512, tokenizer_path=str(folder))
