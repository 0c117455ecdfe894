"""Make `stator/models/tiny-chat/`: the small model `stator run` serves with no arguments.

What it makes: a Hugging Face model directory (config.json, generation_config.json,
tokenizer.json, tokenizer_config.json with a ChatML chat template, model.safetensors) for a
tiny Llama-architecture model (a few million parameters, a few MB) trained for a few minutes
on the CPU, so that what it writes is recognizably English text, not noise.

The text: the King James Version of the Bible (1611). Why it is public domain: the
translation is over 400 years old; its copyright has long expired everywhere except for
the British Crown's perpetual prerogative, which applies only inside the United Kingdom.
Debian ships it as the `bible-kjv-text` package (whose copyright file says "The copyright
for the King James Version text of the Bible is expired"), together with the `bible`
program that decodes it; this machine can reach the Debian archive but not the wider web,
so the script fetches the two packages with `apt-get download`, unpacks them with
`dpkg-deb` (no root needed) and asks `bible` for the whole text. Pass `--text FILE` to
train on another (public-domain) plain-text file instead.

To teach the chat template, a share of the training samples are ChatML conversations in
which the user quotes a verse and the assistant answers with the verses that follow it,
ending with `<|im_end|>`; the rest are plain runs of text.

    python scripts/make_bundled_model.py                # 8 CPU-minutes on one core
    python scripts/make_bundled_model.py --minutes 1    # a quick, worse model

The bundled model was made with the defaults (8 CPU-minutes, ~640 steps of 16 x 128
tokens, final training loss ~3.8). Asked "And God said, Let there be light." it answers
(greedy) "And the LORD said unto Moses, The LORD hath done unto thee, ...".
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

OUT = Path(__file__).resolve().parents[1] / "stator" / "models" / "tiny-chat"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
BOS, EOS = "<s>", "<|im_end|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The model: small enough to train on a laptop CPU in minutes and ship in git (bf16).
ARCH = {
    "vocab_size": 4096,
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 1024,
}


# -- the text --------------------------------------------------------------------------


def kjv_text() -> str:
    """The whole KJV, one verse per line ("Ge1:1 In the beginning ..."), decoded by the
    `bible` program from Debian's `bible-kjv` packages."""
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        data = Path("/usr/lib/bible.data")
        program = shutil.which("bible")
        if not (data.exists() and program):
            subprocess.run(
                ["apt-get", "download", "bible-kjv", "bible-kjv-text"],
                cwd=tmpdir,
                check=True,
                capture_output=True,
            )
            for deb in tmpdir.glob("*.deb"):
                subprocess.run(["dpkg-deb", "-x", str(deb), str(tmpdir / "root")], check=True)
            data = tmpdir / "root/usr/lib/bible.data"
            program = str(tmpdir / "root/usr/bin/bible")
        return subprocess.run(
            # `bible` looks the data file up on its search path (-p), not by a full path.
            [program, "-f", "-l1000", "-p", str(data.parent), "-d", data.name, "Gen1:1-Rev22:21"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout


def kjv_verses(text: str) -> list[str]:
    # Lines look like "Ge1:1 In the beginning God created the heaven and the earth."
    verses = [re.sub(r"^\S+\d+:\d+\s+", "", line).strip() for line in text.splitlines()]
    return [v for v in verses if v]


def file_verses(path: Path) -> list[str]:
    """Sentences-ish units of a plain-text file: its non-empty paragraphs."""
    text = path.read_text(errors="ignore")
    return [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]


# -- the tokenizer ---------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def chat_sample(verses: list[str], rng: random.Random) -> str:
    i = rng.randrange(len(verses) - 4)
    answer = " ".join(verses[i + 1 : i + 1 + rng.randint(1, 3)])
    return f"<|im_start|>user\n{verses[i]}<|im_end|>\n<|im_start|>assistant\n{answer}<|im_end|>\n"


def token_stream(tok: Tokenizer, verses: list[str], seed: int = 0) -> torch.Tensor:
    """The training corpus as one long tensor of ids: the text in order, chunked into
    paragraphs, interleaved with chat samples (about a third of the tokens)."""
    rng = random.Random(seed)
    pieces: list[str] = []
    for start in range(0, len(verses), 8):
        pieces.append(BOS + " ".join(verses[start : start + 8]) + "\n")
        if rng.random() < 0.6:
            pieces.append(chat_sample(verses, rng))
    ids: list[int] = []
    for enc in tok.encode_batch(pieces, add_special_tokens=False):
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.long)


# -- the model -------------------------------------------------------------------------


def llama_config(vocab_size: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **ARCH,
        "vocab_size": vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": SPECIAL_TOKENS.index(BOS),
        "eos_token_id": SPECIAL_TOKENS.index(EOS),
        "pad_token_id": SPECIAL_TOKENS.index("<pad>"),
        "torch_dtype": "bfloat16",
    }


def train(model, data: torch.Tensor, minutes: float, seq_len: int, batch: int, log) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05, betas=(0.9, 0.95))
    # The budget is CPU time, not wall time, so that a busy machine gets the same model
    # (more slowly) as an idle one.
    budget = minutes * 60
    start = time.process_time()
    gen = torch.Generator(device=data.device).manual_seed(0)
    step = 0
    model.train()
    while (spent := time.process_time() - start) < budget:
        # Cosine decay over the time budget, since the budget is time, not steps.
        progress = spent / budget
        lr = 3e-3 * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * (1 + math.cos(math.pi * progress)) / 2)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(
            0, len(data) - seq_len - 1, (batch, 1), generator=gen, device=data.device
        )
        x = data[starts + torch.arange(seq_len, device=data.device)]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            log(f"step {step} loss {loss.item():.3f} lr {lr:.2e} {spent:.0f} cpu-s")
        step += 1


def write_model_dir(out: Path, tok: Tokenizer, model, config: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(tok.to_str())
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": config["max_position_embeddings"],
        "add_bos_token": False,
        "chat_template": CHATML_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "unk_token": "<unk>", "pad_token": "<pad>"})
        + "\n"
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "temperature": 0.8,
        "top_p": 0.95,
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    # Tied embeddings: store the shared matrix once, under the embedding's name.
    state = {
        k: v.detach().to(torch.bfloat16).contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }
    weights = out / "model.safetensors"
    save_file(state, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)  # save_file makes it private; a packaged file must be readable


def sample(out: Path, log) -> None:
    """Load the written directory back with transformers and print a few generations."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    torch.manual_seed(0)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": "And God said, Let there be light."}],
            tokenize=False,
            add_generation_prompt=True,
        ),
        "<s>And the king said unto",
    ]
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        outp = model.generate(ids, max_new_tokens=48, do_sample=True, temperature=0.8, top_p=0.95)
        log(f"{prompt!r} -> {tok.decode(outp[0, ids.shape[1] :])!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--text", type=Path, help="train on this text file instead of the KJV")
    parser.add_argument(
        "--minutes", type=float, default=8.0, help="training budget in CPU minutes (all threads)"
    )
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    # One thread: on a shared machine, extra threads mostly spin-wait and eat the budget.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="torch device to train on")
    parser.add_argument(
        "--kjv-file",
        type=Path,
        help="KJV text saved by --save-kjv (for machines that cannot reach Debian)",
    )
    parser.add_argument("--save-kjv", type=Path, help="write the fetched KJV text here and exit")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, flush=True)  # a script's progress, not a server's log

    if args.text:
        verses = file_verses(args.text)
    else:
        text = args.kjv_file.read_text() if args.kjv_file else kjv_text()
        if args.save_kjv:
            args.save_kjv.write_text(text)
            return
        verses = kjv_verses(text)
    log(f"{len(verses)} verses, {sum(map(len, verses)) / 1e6:.1f} M characters")
    tok = train_tokenizer(verses, ARCH["vocab_size"])
    data = token_stream(tok, verses)
    log(f"tokenizer: {tok.get_vocab_size()} tokens; corpus: {len(data) / 1e6:.2f} M tokens")

    from transformers import LlamaConfig, LlamaForCausalLM

    config = llama_config(tok.get_vocab_size())
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k != "torch_dtype"}))
    log(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters")
    model.to(args.device)
    train(model, data.to(args.device), args.minutes, args.seq_len, args.batch, log)
    model.to("cpu")
    write_model_dir(args.out, tok, model, config)
    size = sum(f.stat().st_size for f in args.out.iterdir()) / 1e6
    log(f"wrote {args.out} ({size:.1f} MB)")
    sample(args.out, log)


if __name__ == "__main__":
    main()
