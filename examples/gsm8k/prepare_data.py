"""GSM8K data for the Relax recipe: convert verl-format parquet, or make a synthetic stand-in offline.

    python3 -m examples.gsm8k.prepare_data --out-dir DATA_DIR \
        [--verl-parquet gsm8k/train.parquet [--verl-test-parquet gsm8k/test.parquet]]

With `--verl-parquet` (the files verl's `examples/data_preprocess/gsm8k.py` writes) the files are
converted by `scripts/tools/process_verl.py`. Without it (this machine has no dataset hub) the
script first writes a small synthetic GSM8K-style set of one-step arithmetic word problems *in verl
format* to `DATA_DIR/verl/{train,test}.parquet`, then converts that, so the recipe and the
conversion step run end to end offline. Either way the Relax rows land in
`DATA_DIR/gsm8k/{train,test}.parquet`: `prompt` (chat messages), `label` (the final number as a
string), `extra_info` (verl's extra_info plus `data_source` and `ability`).

The synthetic rows copy verl's gsm8k layout: the question followed by verl's instruction
`Let's think step by step and output the final answer after "####".`, `reward_model =
{"style": "rule", "ground_truth": "<n>"}`, `data_source = "openai/gsm8k"`, `ability = "math"`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
from types import ModuleType

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROCESS_VERL_PATH = os.path.join(REPO_ROOT, "scripts", "tools", "process_verl.py")
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
DATA_SOURCE = "openai/gsm8k"
NAMES = ("Ana", "Ben", "Mia", "Leo", "Zoe", "Sam")
ITEMS = ("apples", "pens", "books", "cards", "eggs")


def load_process_verl() -> ModuleType:
    """Import scripts/tools/process_verl.py (a script, not a package module) by path."""
    if "process_verl" in sys.modules:
        return sys.modules["process_verl"]
    spec = importlib.util.spec_from_file_location("process_verl", PROCESS_VERL_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["process_verl"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def make_problem(rng: random.Random) -> tuple[str, int, str]:
    """One arithmetic word problem: (question, answer, gsm8k-style worked solution ending in `#### n`)."""
    name, item, kind = rng.choice(NAMES), rng.choice(ITEMS), rng.randrange(4)
    a, b = rng.randint(2, 20), rng.randint(2, 9)
    if kind == 0:
        question, answer, step = f"{name} has {a} {item} and buys {b} more. How many {item} now?", a + b, f"{a}+{b}"
    elif kind == 1:
        a += b
        question, answer, step = f"{name} has {a} {item} and gives away {b}. How many are left?", a - b, f"{a}-{b}"
    elif kind == 2:
        question, answer, step = f"{name} buys {a} bags of {b} {item}. How many {item} in all?", a * b, f"{a}*{b}"
    else:
        question, answer, step = f"{name} splits {a * b} {item} among {b} friends. How many each?", a, f"{a * b}/{b}"
    return question, answer, f"{step} = {answer}\n#### {answer}"


def verl_row(question: str, answer: int, solution: str, *, split: str, index: int) -> dict:
    """A row exactly as verl's gsm8k preprocessing lays it out."""
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
        "extra_info": {"split": split, "index": index, "answer": solution, "question": question},
    }


def make_synthetic_rows(num_rows: int, *, split: str, seed: int) -> list[dict]:
    rng = random.Random(f"{seed}-{split}")
    return [verl_row(*make_problem(rng), split=split, index=i) for i in range(num_rows)]


def write_verl_parquet(rows: list[dict], path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)


def prepare(out_dir: str, *, verl_parquet: str | None = None, verl_test_parquet: str | None = None,
            num_train: int = 512, num_test: int = 64, seed: int = 0) -> dict[str, str]:
    """Write DATA_DIR/gsm8k/{train,test}.parquet; return {"train": path[, "test": path]}."""
    sources = {"train": verl_parquet, "test": verl_test_parquet} if verl_parquet else {}
    if not verl_parquet:
        for split, count in (("train", num_train), ("test", num_test)):
            sources[split] = os.path.join(out_dir, "verl", f"{split}.parquet")
            write_verl_parquet(make_synthetic_rows(count, split=split, seed=seed), sources[split])
    process_verl = load_process_verl()
    outputs = {}
    for split, source in sources.items():
        if source is None:
            continue
        outputs[split] = os.path.join(out_dir, "gsm8k", f"{split}.parquet")
        summary = process_verl.convert(source, outputs[split])
        print(f"prepare_data: {split}: {source} -> {outputs[split]} "
              f"(rows in={summary['rows_in']} out={summary['rows_out']} skipped={summary['skipped']})")
    return outputs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", required=True, help="DATA_DIR; Relax rows go to DATA_DIR/gsm8k/")
    parser.add_argument("--verl-parquet", default=None, help="verl-format gsm8k train parquet (file or directory)")
    parser.add_argument("--verl-test-parquet", default=None, help="verl-format gsm8k test parquet")
    parser.add_argument("--num-train", type=int, default=512, help="synthetic train rows (without --verl-parquet)")
    parser.add_argument("--num-test", type=int, default=64, help="synthetic test rows (without --verl-parquet)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.verl_test_parquet and not args.verl_parquet:
        parser.error("--verl-test-parquet needs --verl-parquet (the train split)")
    prepare(args.out_dir, verl_parquet=args.verl_parquet, verl_test_parquet=args.verl_test_parquet,
            num_train=args.num_train, num_test=args.num_test, seed=args.seed)


if __name__ == "__main__":
    main()
