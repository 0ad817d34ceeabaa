#!/usr/bin/env python3
"""Render tests/fixtures/chat_templates/*.jinja with transformers' own Jinja environment.

transformers compiles chat templates in an ImmutableSandboxedEnvironment(trim_blocks=True,
lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols]) with raise_exception,
strftime_now, dict, namespace and its json.dumps-based tojson. We take that environment from
transformers itself and only pin strftime_now to a fixed date, then render every template over
a corpus of conversations. Output: tests/fixtures/chat_templates/cases.json, a list of
{template, messages, add_generation_prompt, tools, extra, expected | expected_error}.
"""
import datetime
import glob
import json
import os

import jinja2
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                    "chat_templates")
FIXED_NOW = datetime.datetime(2024, 7, 26, 9, 30, 0)  # the C++ test injects the same time
BOS, EOS = "<s>", "</s>"

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}]

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "What is 2+2?"}],
    "multi_turn": [{"role": "user", "content": "Hi"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke."}],
    "system_multi_turn": [{"role": "system", "content": "  Be nice.  \n"},
                          {"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hey."},
                          {"role": "user", "content": "Bye"},
                          {"role": "assistant", "content": "See you!"}],
    "assistant_last": [{"role": "user", "content": "Finish this: roses are"},
                       {"role": "assistant", "content": "red"}],
    "unicode": [{"role": "user", "content": "Grüß dich! 你好 🤖🚀 — “quotes” \t tab"},
                {"role": "assistant", "content": "¡Hola! 😀"},
                {"role": "user", "content": "e\u0301 \u00a0nbsp"}],
    "jinja_text": [{"role": "user", "content": "Render {{ x }} and {% if y %}z{% endif %} {# c #} literally"}],
    "whitespace": [{"role": "user", "content": "\n\n  padded  \n\n"},
                   {"role": "assistant", "content": "   "},
                   {"role": "user", "content": "line1\nline2\r\nline3"}],
    "bad_alternation": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    "system_only": [{"role": "system", "content": "Only a system message."}],
    "tool_call": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21.5°C and clear in Paris."},
        {"role": "user", "content": "Thanks"},
    ],
    "two_tool_results": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call00001", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "call00002", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "call00001", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call00002", "content": "rain"},
    ],
    "reasoning": [
        {"role": "user", "content": "What is 3*7?"},
        {"role": "assistant", "content": "21", "reasoning_content": "3 times 7 is 21."},
        {"role": "user", "content": "And 4*5?"},
        {"role": "assistant", "content": "<think>\n4 times 5.\n</think>\n\n20"},
    ],
    "reasoning_inline_history": [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "<think>old thoughts</think>A1"},
        {"role": "user", "content": "Q2"},
    ],
    "gemma_parts": [
        {"role": "system", "content": [{"type": "text", "text": "Sys part."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": " Describe. "}]},
    ],
}

TOOL_TEMPLATES = {"llama3_1", "llama3_2", "qwen2_5", "qwen3", "mistral_v3"}


def render(tmpl, messages, agp, tools, extra):
    ctx = dict(messages=messages, tools=tools, documents=None, add_generation_prompt=agp,
               bos_token=BOS, eos_token=EOS)
    ctx.update(extra)
    return tmpl.render(**ctx)


def main():
    cases = []
    for path in sorted(glob.glob(os.path.join(HERE, "*.jinja"))):
        name = os.path.basename(path)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        tmpl = _compile_jinja_template(source)
        tmpl.environment.globals["strftime_now"] = lambda fmt: FIXED_NOW.strftime(fmt)
        stem = name[:-len(".jinja")]
        variants = []
        for conv_name, messages in CONVERSATIONS.items():
            for agp in (False, True):
                variants.append((conv_name, messages, agp, None, {}))
            if stem in TOOL_TEMPLATES and conv_name in ("single_user", "system_user", "tool_call",
                                                        "two_tool_results"):
                variants.append((conv_name, messages, True, TOOLS, {}))
            if stem == "qwen3":
                variants.append((conv_name, messages, True, None, {"enable_thinking": False}))
            if stem.startswith("llama3_"):
                variants.append((conv_name, messages, True, None, {"date_string": "01 Jan 2025"}))
                if conv_name == "system_user":
                    variants.append((conv_name, messages, True, TOOLS,
                                     {"tools_in_user_message": False}))
        for conv_name, messages, agp, tools, extra in variants:
            case = {"template": name, "conversation": conv_name, "messages": messages,
                    "add_generation_prompt": agp, "tools": tools, "extra": extra}
            try:
                case["expected"] = render(tmpl, messages, agp, tools, extra)
            except Exception as e:  # TemplateError, TypeError, ...: the C++ side must fail too
                case["expected_error"] = str(e)
                case["error_type"] = type(e).__name__
            cases.append(case)
    out = os.path.join(HERE, "cases.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("expected_error" in c for c in cases)
    print(f"{out}: {len(cases)} cases ({n_err} expected errors)")


if __name__ == "__main__":
    main()
