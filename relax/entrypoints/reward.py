"""`relax-reward`: score one response with a built-in reward type from the command line.

    relax-reward --rm-type math --response 'so \\boxed{\\frac{1}{2}}' --label 0.5
    relax-reward --rm-type f1 --response 'The Eiffel Tower' --label-json '["Eiffel Tower in Paris"]'

Prints the result as JSON (a number, or an object for dict rewards such as `dapo`). It calls
`relax.engine.rewards.grade`, the same code the reward executor runs, and imports no torch.
"""

from __future__ import annotations

import argparse
import json
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="relax-reward", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rm-type", required=True, help="built-in reward type, e.g. math, f1, boxed_f1")
    parser.add_argument("--response", required=True, help="the model response text")
    label = parser.add_mutually_exclusive_group(required=True)
    label.add_argument("--label", help="the label as a plain string")
    label.add_argument("--label-json", help="the label as JSON (lists, dicts, numbers)")
    parser.add_argument("--metadata", default="{}", help="row metadata as a JSON object")
    parser.add_argument("--prompt", default="", help="the prompt (sent by remote_rm)")
    parser.add_argument("--rm-url", default=None, help="reward service URL for remote_rm")
    parser.add_argument("--timeout", type=float, default=60.0, help="remote_rm time budget in seconds")
    return parser


def _json_arg(parser: argparse.ArgumentParser, flag: str, text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        parser.error(f"{flag} is not valid JSON ({exc}): {text!r}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    label = ns.label if ns.label_json is None else _json_arg(parser, "--label-json", ns.label_json)
    metadata = _json_arg(parser, "--metadata", ns.metadata)
    if not isinstance(metadata, dict):
        parser.error(f"--metadata must be a JSON object, got {type(metadata).__name__}")

    from relax.engine.rewards.registry import grade

    try:
        result = grade(ns.rm_type, ns.response, label, metadata, prompt=ns.prompt, rm_url=ns.rm_url,
                       timeout=ns.timeout)
    except ValueError as exc:
        print(f"relax-reward: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
