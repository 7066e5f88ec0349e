"""A config's strings reach the terminal (and REPORT.md, report.html) shown, never obeyed: escape
sequences and other control characters print as visible escapes (onboard/sanitize.py), rich markup
prints as the brackets it is, HTML renders as text; --json keeps the original strings."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from onboard.cli.app import app
from onboard.cli.views import criteria_table
from onboard.sanitize import html_safe, markup_safe, visible

MODEL_TYPE = "evil\x1b[2J[bold red]x[/]"
KEY = "x\x1b]52;c;aGk=\x07[link=https://example.com]key[/link]\r"
VALUE = "[bold red]boom[/]\x9b31m"
WHY = "[bold red]on purpose[/] \x1b[31m<img src=x onerror=alert(1)>"
RAW = ("\x1b", "\x07", "\r", "\x9b")
CONFIG = {
    "architectures": ["EvilForCausalLM"], "model_type": "evil", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, KEY: VALUE,
}  # fmt: skip
runner = CliRunner()


def onboard(*args):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})  # no wrapping inside a string
    assert result.exit_code == 0, result.stderr
    assert not any(c in result.stdout + result.stderr for c in RAW), repr(result.stdout)
    return result


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    d = tmp_path_factory.mktemp("evil")
    (d / "config.json").write_text(json.dumps(CONFIG))
    result = onboard("new-model", "m", "--hf-config", d / "config.json", "--path", "port", "--device", "cpu",
                     "--dir", d)  # fmt: skip
    # new-model refuses such a model_type (it would be code in model.py); an edit afterwards is what shows it
    ws_config = d / "onboarding" / "m" / "config.json"
    ws_config.write_text(json.dumps({**json.loads(ws_config.read_text()), "model_type": MODEL_TYPE}))
    return d, result.stdout


def test_new_model_refuses_a_model_type_that_is_not_a_name(tmp_path):
    for bad in (MODEL_TYPE, 'llama"""\nimport os  #', "llama\nx = 1"):
        (tmp_path / "config.json").write_text(json.dumps({**CONFIG, "model_type": bad}))
        result = runner.invoke(app, ["new-model", "m", "--hf-config", str(tmp_path / "config.json"), "--path", "port",
                                     "--dir", str(tmp_path)])  # fmt: skip
        assert result.exit_code == 2, result.stderr
        assert "model_type = " in result.stderr and "is not accepted" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not any(c in result.stderr for c in RAW)
        assert not (tmp_path / "onboarding").exists()


def test_the_sanitiser():
    assert visible("a\x1b[2Jb\x07\r\n\t\x9b\u202e") == "a\\x1b[2Jb\\x07\\x0d\\x0a\\x09\\x9b\\u202e"
    assert visible("one\n\ttwo\x1b\r", keep_newlines=True) == "one\n\ttwo\\x1b\\x0d"
    assert markup_safe("[bold]x[/]\x1b") == "\\[bold]x\\[/]\\x1b"
    assert html_safe("<b>&\x1b") == "&lt;b&gt;&amp;\\x1b"
    assert visible("plain ümlaut [text]") == "plain ümlaut [text]"


def test_new_model_shows_the_config_strings_as_written(made):
    _, text = made
    assert "model_type evil)" in text
    assert 'x\\x1b]52;c;aGk=\\x07[link=https://example.com]key[/link]\\x0d = "[bold red]boom[/]\\u009b31m"' in text


def test_status_list_and_waive_show_them_too(made):
    d, _ = made
    waived = onboard("waive", "m", "parity", "logits_rel_l2", "--why", WHY, "--dir", d).stdout
    shown_why = "[bold red]on purpose[/] \\x1b[31m<img src=x onerror=alert(1)>"
    assert f"WAIVED parity/logits_rel_l2: {shown_why}" in waived
    status = onboard("status", "m", "--dir", d).stdout
    assert "m: evil\\x1b[2J[bold red]x[/] (port path, family llama3, device cpu)" in status
    assert f"parity/logits_rel_l2: {shown_why}" in status
    listing = onboard("list", "--dir", d).stdout
    assert "evil\\x1b[2J[bold red]x[/]" in listing
    data = json.loads(onboard("status", "m", "--dir", d, "--json").stdout)
    assert data["model_type"] == MODEL_TYPE and data["unconsumed_keys"] == [KEY]  # JSON: the original strings
    assert data["waivers"][0]["why"] == WHY


def test_a_table_cell_from_a_checkpoint_name():
    console = Console(file=io.StringIO(), width=300, highlight=False)
    criterion = {"name": "grad_worst_param", "value": "layers.0.[red]w[/]\x1b[2J", "ok": False,
                 "comparator": "<=", "threshold": 1.0}  # fmt: skip
    console.print(criteria_table([criterion]))
    text = console.file.getvalue()
    assert "layers.0.[red]w[/]\\x1b[2J" in text and "\x1b" not in text


def test_the_report_files(made):
    d, _ = made
    onboard("waive", "m", "eager", "loss_falls", "--why", WHY, "--dir", d)
    onboard("report", "m", "--dir", d)
    ws = d / "onboarding" / "m"
    md, page = (ws / "REPORT.md").read_text(), (ws / "report.html").read_text()
    assert not any(c in md + page for c in RAW)
    assert "evil\\x1b[2J[bold red]x[/]" in md
    assert "<img src=x" not in page and "&lt;img src=x onerror=alert(1)&gt;" in page  # HTML shown as text
    assert page.count("<details><summary>details</summary>") == md.count("<details><summary>details</summary>")
