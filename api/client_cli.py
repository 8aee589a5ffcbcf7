"""Client subcommands of ``logbus`` (topics, produce, consume, bench): HTTP to a broker."""

from __future__ import annotations

import argparse


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Filled in below; kept separate so ``serve`` does not import the HTTP client."""
