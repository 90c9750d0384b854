#!/usr/bin/python3
"""Renders chat templates as Hugging Face transformers does, with Debian's python3-jinja2: the
reference that tests/model/chat_template_test.cpp compares tandem's interpreter with, byte for byte.

  chat_template_reference.py OUT_DIR CONVERSATION_DIR TEMPLATE_DIR...

For every template T (*.jinja) of the N-th TEMPLATE_DIR (from 0) and conversation C (*.json)
writes OUT_DIR/N-T__C.out (the rendered bytes) or OUT_DIR/N-T__C.err (the error: its message on
the first line, the exception's type on the second). A conversation file holds
{"messages": [...], "tools": [...] (optional), "add_generation_prompt": bool, "bos_token": "...",
"eos_token": "..."}.

The environment is transformers' (_compile_jinja_template): ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loopcontrols; its AssistantTracker extension's {% generation %}
block (rendered as its body); a tojson filter that is json.dumps(ensure_ascii=False); globals
raise_exception and strftime_now. strftime_now reads a fixed clock (2026-09-15 10:30:00) so the
output is reproducible; tandem's test gives its renderer the same instant.
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime.datetime(2026, 9, 15, 10, 30, 0)


class GenerationExtension(Extension):
    """transformers' AssistantTracker when no assistant mask is asked for: the body as it is."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class TemplateError(Exception):
    pass


def raise_exception(message):
    raise TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationExtension, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, source, conversation):
    template = env.from_string(source)
    return template.render(messages=conversation["messages"], tools=conversation.get("tools"),
                           add_generation_prompt=conversation.get("add_generation_prompt", False),
                           bos_token=conversation.get("bos_token", ""), eos_token=conversation.get("eos_token", ""))


def main():
    out_dir, conv_dir, template_dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out_dir, exist_ok=True)
    conversations = {}
    for name in sorted(os.listdir(conv_dir)):
        if name.endswith(".json"):
            with open(os.path.join(conv_dir, name), encoding="utf-8") as f:
                conversations[name[:-5]] = json.load(f)
    env = environment()
    for index, template_dir in enumerate(template_dirs):
        for name in sorted(os.listdir(template_dir)):
            if not name.endswith(".jinja"):
                continue
            with open(os.path.join(template_dir, name), encoding="utf-8") as f:
                source = f.read()
            for conv_name, conversation in conversations.items():
                base = os.path.join(out_dir, f"{index}-{name[:-6]}__{conv_name}")
                try:
                    text = render(env, source, conversation)
                except Exception as e:  # any failure is a result: tandem must fail too
                    with open(base + ".err", "w", encoding="utf-8") as f:
                        f.write(f"{e}\n{type(e).__name__}\n")
                    continue
                with open(base + ".out", "wb") as f:
                    f.write(text.encode("utf-8", "surrogatepass"))


if __name__ == "__main__":
    main()
