"""A minimal OpenAI-style streaming chat endpoint in front of stator's mocker, for
benchmarks only (NOT stator's frontend, which lives in `stator/frontend/`).

It exists so that `mocker_fidelity.py` can drive stator's mocker through the same HTTP
client, loopback socket and per-request tokenization as Dynamo's frontend + mocker, until
`stator run --engine mocker` is in main. It does what the comparison needs and nothing more:
chat template + tokenization, one SSE chunk per generated token, usage with cached tokens.

    python benchmarks/mocker_http_shim.py --port 8000 --model-dir DIR [mocker flags]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from pathlib import Path

import jinja2
from aiohttp import web
from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stator.config import add_flags, from_args
from stator.engines.base import EngineError
from stator.engines.mocker import MockerConfig, create_engine
from stator.protocols import EngineRequest, StopConditions


def build_app(
    engine, tokenizer: Tokenizer, template: jinja2.Template, name: str
) -> web.Application:
    ids = itertools.count()

    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            messages = body["messages"]
            max_tokens = int(body.get("max_tokens") or 16)
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": {"message": f"bad request: {exc}"}}, status=400)
        prompt = template.render(messages=messages, add_generation_prompt=True)
        token_ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        req = EngineRequest(
            request_id=f"chat-{next(ids)}",
            model=name,
            token_ids=token_ids,
            stop=StopConditions(
                max_tokens=max_tokens,
                min_tokens=int(body.get("min_tokens") or 0),
                ignore_eos=bool(body.get("ignore_eos")),
            ),
        )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        created = int(time.time())
        try:
            async for out in engine.generate(req):
                parts = []
                for tok in out.token_ids:
                    text = tokenizer.decode([tok]) or "?"
                    chunk = {
                        "id": req.request_id,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": name,
                        "choices": [{"index": 0, "delta": {"content": text}}],
                    }
                    parts.append(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if out.usage is not None:
                    usage = {
                        "prompt_tokens": out.usage.prompt_tokens,
                        "completion_tokens": out.usage.completion_tokens,
                        "prompt_tokens_details": {"cached_tokens": out.usage.cached_tokens},
                    }
                    parts.append(
                        b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
                    )
                if parts:
                    await resp.write(b"".join(parts))
        except EngineError as exc:
            await resp.write(b"data: " + json.dumps({"error": str(exc)}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def serve(args: argparse.Namespace) -> None:
    model_dir = Path(args.model_dir)
    engine = create_engine(from_args(MockerConfig, args), str(model_dir), args.model_name)
    await engine.start()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    template_text = json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    app = build_app(engine, tokenizer, jinja2.Template(template_text), args.model_name)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.port).start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--model-name", default="tiny")
    add_flags(parser, MockerConfig)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
