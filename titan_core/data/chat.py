"""Chat/SFT rows: a conversation through its chat template, trained on assistant tokens only.

The template is rendered with jinja2 the way transformers' `apply_chat_template` does: a
sandboxed environment with `trim_blocks` / `lstrip_blocks`, the loop-control extension,
`raise_exception`, `strftime_now`, a `tojson` that does not escape HTML, and the variables
`messages`, `add_generation_prompt = False` and the tokenizer's special tokens (`bos_token`,
`eos_token`, ...). A `{% generation %}` block (transformers' assistant-mask marker) renders
its body.

Which tokens are the assistant's: the conversation is rendered prefix by prefix, and the
characters that message i adds are `render(messages[:i+1])` past `render(messages[:i])`. The
whole rendering is tokenized once (no BOS / EOS added: the template writes its own) and a
token is a target when it starts inside the characters an assistant message added (its
header and end-of-turn tokens included: the model learns to end its turn). A template whose
rendering of a prefix is not a prefix of the whole (one that rewrites earlier turns) cannot be
split this way: such a conversation is a bad row, counted, not trained on.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from titan_core.config.loader import ConfigError


class BadRow(Exception):
    """A row the loader skips and counts; `reason` is a key of dataset_files.BAD_REASONS."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Generation(Extension):
    """`{% generation %}...{% endgeneration %}` renders its body (the spans come from prefixes here)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class ChatTemplate:
    """A compiled chat template; `origin` names where it came from, for error messages."""

    def __init__(self, source: str, *, origin: str, special_tokens: dict[str, str]):
        self.source = source
        self.origin = origin
        self.special_tokens = dict(special_tokens)
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ConfigError(
                f"the chat template of {origin} does not compile: {e.message} (line {e.lineno})"
            ) from None

    def render(self, messages: list[dict[str, Any]]) -> str:
        try:
            return self._template.render(messages=messages, add_generation_prompt=False, **self.special_tokens)
        except jinja2.TemplateError as e:  # raise_exception in the template: this conversation breaks its rules
            raise BadRow("template_error") from e


def template_for(data_template: str, tokenizer) -> ChatTemplate:
    """`data.chat_template` when set, else the tokenizer's own; a ConfigError when neither exists."""
    specials = getattr(tokenizer, "special_tokens", {})
    if data_template:
        return ChatTemplate(data_template, origin="data.chat_template", special_tokens=specials)
    own = getattr(tokenizer, "chat_template", None)
    if not own:
        where = getattr(tokenizer, "config_path", None) or getattr(tokenizer, "path", "the tokenizer")
        raise ConfigError(
            f"data.format = 'chat' needs a chat template: '{where}' has none (no chat_template in "
            "tokenizer_config.json, no chat_template.jinja); set data.chat_template"
        )
    origin = str(getattr(tokenizer, "config_path", None) or tokenizer.path)
    return ChatTemplate(own, origin=origin, special_tokens=specials)


def check_messages(value: Any) -> list[dict[str, str]]:
    """The conversation of a row's `messages`, or BadRow: a non-empty list of {role, content}
    with string values and at least one assistant message."""
    if not isinstance(value, list):
        raise BadRow("non_string")
    if not value:
        raise BadRow("empty")
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise BadRow("malformed")
    if not any(m["role"] == "assistant" for m in value):
        raise BadRow("no_assistant")
    # only the two keys: a parquet row's struct carries every key any row had, as None
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _empty(template: ChatTemplate) -> str:
    """The rendering of no message (a template may write a default system prompt); "" if it refuses."""
    try:
        return template.render([])
    except BadRow:
        return ""


def conversation_tokens(
    tokenizer, template: ChatTemplate, messages: list[dict[str, str]]
) -> tuple[list[int], list[bool]]:
    """(ids, target) of a conversation: target[j] says token j was added by an assistant message."""
    whole = template.render(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = template.render(messages[:i]) if i else _empty(template)
        after = template.render(messages[: i + 1]) if i + 1 < len(messages) else whole
        if not (whole.startswith(after) and after.startswith(before)):
            raise BadRow("not_prefix_stable")
        spans.append((len(before), len(after)))
    ids, offsets = tokenizer.encode_with_offsets(whole)
    if not ids:
        raise BadRow("empty")
    target = [False] * len(ids)
    k = 0  # offsets and spans both increase: one sweep
    for j, (start, _) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        target[j] = k < len(spans) and spans[k][0] <= start
    if not any(target):
        raise BadRow("no_assistant")
    return ids, target
