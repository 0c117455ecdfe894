"""Models whose output is scripted to exercise the parsers through the frontend: a
tool-aware ChatML template (Hermes `<tool_call>` style, Qwen3's `enable_thinking`) on the
tiny test tokenizer, and `ScriptedEngine` workers replaying fixed reasoning / tool-call text.
"""

from __future__ import annotations

from pathlib import Path

from stator.llm import Tokenizer
from tests.fakes import ScriptedEngine
from tests.frontend.harness import Stack
from tests.model_factory import make_model_dir

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}<|im_start|>tool\n{{ message.content }}<|im_end|>\n"
    "{%- elif message.tool_calls %}<|im_start|>assistant\n{{ message.content or '' }}"
    '{% for call in message.tool_calls %}<tool_call>{"name": "{{ call.function.name }}", '
    '"arguments": {{ call.function.arguments }}}</tool_call>{% endfor %}<|im_end|>\n'
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n"
    "{% endif %}{% endif %}"
)

THINK = "test/think"  # deepseek_r1: reasoning, then the answer
TOOLS = "test/tools"  # qwen3 + hermes: reasoning, a preamble and two calls
ONE_CALL = "test/one-call"  # hermes: one call of get_weather
NO_CALL = "test/no-call"  # hermes: plain text although tools were offered
NO_PARSER = "test/no-parser"  # no parsers at all

THINK_TEXT = "<think>I should greet them.</think>Hello there, friend!"
TOOLS_TEXT = (
    "<think>Weather and time are needed.</think>Let me check."
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}</tool_call>'
    '<tool_call>{"name": "get_time", "arguments": {"tz": "CET"}}</tool_call>'
)
ONE_CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
NO_CALL_TEXT = "I will not call anything."

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
TOOLS_LIST = [WEATHER_TOOL, TIME_TOOL]

# (model, script text, card fields)
MODELS = [
    (THINK, THINK_TEXT, {"reasoning_parser": "deepseek_r1"}),
    (TOOLS, TOOLS_TEXT, {"reasoning_parser": "qwen3", "tool_call_parser": "hermes"}),
    (ONE_CALL, ONE_CALL_TEXT, {"tool_call_parser": "hermes"}),
    (NO_CALL, NO_CALL_TEXT, {"tool_call_parser": "hermes"}),
    (NO_PARSER, THINK_TEXT, {}),
]


def start_parser_stack(directory: Path) -> tuple[Stack, dict[str, ScriptedEngine]]:
    model_dir = make_model_dir(directory, chat_template=TOOLS_TEMPLATE)
    tokenizer = Tokenizer.from_dir(model_dir)
    eos = tokenizer.eos_token_ids[0]
    stack = Stack(model_dir).start()
    engines = {}
    try:
        for i, (name, text, card) in enumerate(MODELS):
            script = [*tokenizer.encode(text), eos]
            assert tokenizer.decode(script) == text  # the script says exactly this
            engine = ScriptedEngine(name, script=script, eos_token_id=eos, structured_output=False)
            stack.add_worker(engine, f"stator.parsed{i}.generate", wait_model=name, **card)
            engines[name] = engine
    except BaseException:
        stack.stop()
        raise
    return stack, engines
