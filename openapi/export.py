"""Write (or check) ``openapi/openapi.json`` from the app: ``python -m openapi.export [--check]``.

CI runs the check through the test suite: a change to the API that is not exported fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SPEC_PATH = Path(__file__).with_name("openapi.json")


def current_spec() -> dict[str, Any]:
    from api.app import create_fastapi
    from api.settings import Settings

    spec: dict[str, Any] = create_fastapi(Settings()).openapi()
    return spec


def render(spec: dict[str, Any]) -> str:
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args(argv)
    text = render(current_spec())
    if args.check:
        if not SPEC_PATH.exists() or SPEC_PATH.read_text() != text:
            print("openapi/openapi.json is out of date: run `python -m openapi.export`")
            return 1
        return 0
    SPEC_PATH.write_text(text)
    print(f"wrote {SPEC_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
