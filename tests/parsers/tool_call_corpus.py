"""Tool-call output per format, written from each format's documentation: well-formed,
several calls, text around calls, malformed and truncated output.

Each case: (parser, output, expected content, expected [(name, arguments)])."""

from __future__ import annotations

HERMES = ("<tool_call>", "</tool_call>")
MISTRAL = ("[TOOL_CALLS]", "[ARGS]")
LLAMA = ("<|python_tag|>",)
PYTHONIC = ("<|python_start|>", "<|python_end|>")
QWEN_CODER = (
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
)
DEEPSEEK = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
)
HARMONY = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
)

MARKERS = {
    "hermes": HERMES,
    "mistral": MISTRAL,
    "llama3_json": LLAMA,
    "pythonic": PYTHONIC,
    "qwen3_coder": QWEN_CODER,
    "deepseek_v3": DEEPSEEK,
    "harmony": HARMONY,
}

QWEN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "extra": {"type": "object"},
                    "ids": {"type": "array"},
                },
            },
        },
    }
]

DS_CALL = (
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>"
)

CASES = [
    # -- hermes ---------------------------------------------------------------------------
    ("hermes", "No tools needed.", "No tools needed.", []),
    (
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call>",
        "Let me check.\n",
        [("get_weather", {"city": "Paris"})],
    ),
    (
        "hermes",
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", '
        '"arguments": {"x": [1, 2]}}</tool_call>',
        "\n",
        [("a", {}), ("b", {"x": [1, 2]})],
    ),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": "{\\"q\\": \\"東京\\"}"}</tool_call>',
        "",
        [("f", {"q": "東京"})],
    ),
    ("hermes", "<tool_call>{not json}</tool_call> after", "{not json} after", []),
    ("hermes", '<tool_call>{"arguments": {}}</tool_call>', '{"arguments": {}}', []),
    ("hermes", '<tool_call>{"name": "f", "argu', '{"name": "f", "argu', []),
    ("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n', "", [("f", {"a": 1})]),
    ("hermes", "a < b and <tool> is not <tool_call", "a < b and <tool> is not <tool_call", []),
    ("hermes", "<tool_call></tool_call>", "", []),
    ("hermes", "stray </tool_call> end marker", "stray  end marker", []),
    # -- llama3_json ----------------------------------------------------------------------
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "SF"}}',
        "",
        [("get_weather", {"city": "SF"})],
    ),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {}}', "", [("f", {})]),
    (
        "llama3_json",
        '  \n{"name": "a", "parameters": {"x": 1}}; {"name": "b", "arguments": {"y": true}}',
        "",
        [("a", {"x": 1}), ("b", {"y": True})],
    ),
    ("llama3_json", "Hello there, {not a call}", "Hello there, {not a call}", []),
    ("llama3_json", '{"name": "f", "parameters": {', '{"name": "f", "parameters": {', []),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3_json", "<|python_tag|>oops", "oops", []),
    ("llama3_json", "", "", []),
    # -- mistral --------------------------------------------------------------------------
    (
        "mistral",
        'Sure. [TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
        "Sure. ",
        [("f", {"a": 1}), ("g", {})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]ping[ARGS]{}',
        "",
        [("get_weather", {"city": "Paris"}), ("ping", {})],
    ),
    ("mistral", '[TOOL_CALLS][{"name": "f", "argum', ' [{"name": "f", "argum'.strip(), []),
    ("mistral", "[TOOL_CALLS]f[ARGS]{bad", "f{bad", []),
    ("mistral", "Plain [answer] with [TOOL brackets", "Plain [answer] with [TOOL brackets", []),
    # -- pythonic -------------------------------------------------------------------------
    (
        "pythonic",
        '[get_weather(city="SF", days=3), ping()]',
        "",
        [("get_weather", {"city": "SF", "days": 3}), ("ping", {})],
    ),
    (
        "pythonic",
        '[f(a=true, b=null, c=[1, 2.5], d={"k": "v"}, e=False, t=(1, 2))]',
        "",
        [("f", {"a": True, "b": None, "c": [1, 2.5], "d": {"k": "v"}, "e": False, "t": [1, 2]})],
    ),
    ("pythonic", "<|python_start|>[f(x=1)]<|python_end|>", "", [("f", {"x": 1})]),
    ("pythonic", "Not a call", "Not a call", []),
    ("pythonic", "[1, 2, 3]", "[1, 2, 3]", []),
    ("pythonic", '[f(x="unterminated', '[f(x="unterminated', []),
    ("pythonic", "[f(1)]", "[f(1)]", []),
    ("pythonic", "[f(**kw)]", "[f(**kw)]", []),
    ("pythonic", "<|python_start|>[oops", "[oops", []),
    # -- qwen3_coder ----------------------------------------------------------------------
    (
        "qwen3_coder",
        "I'll check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
        '<parameter=extra>\n{"a": [1]}\n</parameter>\n<parameter=ids>\n[1, 2]\n</parameter>\n'
        "</function>\n</tool_call>",
        "I'll check.\n",
        [
            (
                "get_weather",
                {"city": "New York", "days": 3, "metric": True, "extra": {"a": [1]}, "ids": [1, 2]},
            )
        ],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nmulti\nline\n</parameter>\n</function>\n"
        "</tool_call>\n<tool_call>\n<function=ping>\n</function>\n</tool_call>",
        "\n",
        [("get_weather", {"city": "multi\nline"}), ("ping", {})],
    ),
    (
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "\n\n\nPar",
        [],
    ),
    ("qwen3_coder", "<tool_call>no function here</tool_call>", "no function here", []),
    (
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\n"
        "</tool_call>",
        "",
        [("get_weather", {"days": "three"})],
    ),
    # -- deepseek_v3 ----------------------------------------------------------------------
    (
        "deepseek_v3",
        "Checking.<｜tool▁calls▁begin｜>"
        + DS_CALL.format(name="get_weather", args='{"city": "Beijing"}')
        + "<｜tool▁calls▁end｜>",
        "Checking.",
        [("get_weather", {"city": "Beijing"})],
    ),
    (
        "deepseek_v3",
        "<｜tool▁calls▁begin｜>"
        + DS_CALL.format(name="a", args="{}")
        + "\n"
        + DS_CALL.format(name="b", args='{"n": 1}')
        + "<｜tool▁calls▁end｜>done",
        "done",
        [("a", {}), ("b", {"n": 1})],
    ),
    (
        "deepseek_v3",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Oslo"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "",
        [("get_weather", {"city": "Oslo"})],
    ),
    (
        "deepseek_v3",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{",
        "functionf\n```json\n{",
        [],
    ),
    ("deepseek_v3", "no calls <｜tool", "no calls <｜tool", []),
    ("deepseek_v3", "stray <｜tool▁sep｜>sep<｜tool▁calls▁end｜>", "stray sep", []),
    # -- harmony (text level) -------------------------------------------------------------
    (
        "harmony",
        "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>"
        "Answer.<|return|>",
        "Answer.",
        [],
    ),
    (
        "harmony",
        "<|channel|>analysis<|message|>Need it.<|end|><|start|>assistant<|channel|>commentary to="
        'functions.get_weather <|constrain|>json<|message|>{"city":"SF"}<|call|>',
        "",
        [("get_weather", {"city": "SF"})],
    ),
    (
        "harmony",
        "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant to=functions.ping"
        "<|channel|>commentary json<|message|>{}<|call|>",
        "Let me look.",
        [("ping", {})],
    ),
    (
        "harmony",
        '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}',
        "",
        [("f", {"a": 1})],
    ),
    ("harmony", '<|channel|>commentary to=functions.f<|message|>{"a": ', "", []),
    ("harmony", "plain words", "plain words", []),
    ("harmony", "<|channel|>final<|message|>Typed <|en", "Typed <|en", []),
]
