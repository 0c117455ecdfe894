"""`stator download`: fetch a model from the Hugging Face Hub (or check a local directory)
and print where its files are."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from stator.config import add_flags, from_args
from stator.worker.model_resolution import DownloadConfig, ModelNotFound, resolve_model

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Fetch a model from the Hugging Face Hub into the local cache (token from HF_TOKEN) "
    "and print its local path."
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("download", help=DESCRIPTION, description=DESCRIPTION)
    parser.add_argument("model", help="Hugging Face repo id (org/name) or a local directory")
    add_flags(parser, DownloadConfig)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = from_args(DownloadConfig, args)
    try:
        path = resolve_model(
            args.model,
            revision=config.revision,
            allow_patterns=config.allow_patterns,
            ignore_patterns=config.ignore_patterns,
            cache_dir=config.cache_dir,
        )
    except ModelNotFound as exc:
        log.error("%s", exc)
        return 1
    print(path)  # the command's output: the path, for scripts to capture
    return 0
