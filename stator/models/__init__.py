"""Models that ship inside the stator package.

`tiny-chat/`: a 2.4 M-parameter Llama trained for a few CPU minutes on the King James
Bible (public domain) with a ChatML template; what `stator run` serves with no arguments.
Made by `scripts/make_bundled_model.py`.
"""

from pathlib import Path

BUNDLED_DIR = Path(__file__).resolve().parent
TINY_CHAT = BUNDLED_DIR / "tiny-chat"


def bundled_model_dir(name: str = "tiny-chat") -> Path:
    path = BUNDLED_DIR / name
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no bundled model {name!r} in {BUNDLED_DIR}")
    return path
