"""Print an agentic example's result: `eval accuracy: before=<x> after=<y>` (summary.json) and the
held-out tool-call rate before and after training (metrics.jsonl, eval/<name>/multi_turn/tool_call_rate).

    python3 scripts/training/agentic/summary.py RUN_DIR [EVAL_NAME]
"""

from __future__ import annotations

import json
import os
import sys


def main(run_dir: str, name: str = "heldout") -> None:
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)[name]
    key = f"eval/{name}/multi_turn/tool_call_rate"
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        rates = [row[key] for row in map(json.loads, f) if key in row]
    print(f"eval accuracy: before={summary['before']:.3f} after={summary['after']:.3f}")
    print(f"tool-call rate: before={rates[0]:.3f} after={rates[-1]:.3f}")


if __name__ == "__main__":
    main(*sys.argv[1:])
