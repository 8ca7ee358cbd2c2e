"""Every flag of the seeds' configuration reference, classified (`relax.config.status`).

Each flag of `reference_flags.txt` (a snapshot of the seeds' table, compared with the seeds when
../shared/seeds is present) is one of:
- acts (or acts under the megatron backend): some test names it, and the walk names that test;
  the few without one are listed in ACTS_WITHOUT_TEST, a list that may only shrink;
- needs hardware or a dependency this build excludes: the reason names it;
- no effect here, with a logged reason;
- still unbuilt (not built, or unknown to the parser): listed in STILL_UNBUILT, a list that may
  only shrink; building one fails this test until it is taken off.
`python3 tests/unit/config/test_reference_flags.py` prints the table (flag, status, its test) and,
with `--regenerate`, rewrites the snapshot from the seeds.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

from relax.config.fields import flag_name  # noqa: E402
from relax.config.schema import GROUPS  # noqa: E402
from relax.config.status import flag_status  # noqa: E402

SNAPSHOT = HERE / "reference_flags.txt"
SEED = ROOT.parent / "shared" / "seeds" / "001_09bbd3f02ab2c0ea.txt"
WALKERS = {"test_reference_flags.py", "test_flag_declarations.py"}  # tests that iterate every flag

FIELDS = {flag_name(f): f for cls in GROUPS.values() for f in dataclasses.fields(cls)}
REFERENCE = [line.split("\t")[0] for line in SNAPSHOT.read_text().splitlines() if line.startswith("--")]
PASSTHROUGH = {"--sglang-mem-fraction-static"}  # an SGLang server option (--sglang-<option>)

# Unknown to the parser or not built yet. Only shrinks: issue 34 builds them.
STILL_UNBUILT: frozenset[str] = frozenset()

# Act, but no test names them yet. Only shrinks.
ACTS_WITHOUT_TEST: frozenset[str] = frozenset()


def _test_texts() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text(errors="replace") for p in (ROOT / "tests").rglob("*.py")
            if p.name not in WALKERS}


TESTS = _test_texts()


def status(flag: str) -> tuple[str, str]:
    if flag in PASSTHROUGH:
        return "acts", "SGLang server option, passed through"
    if flag not in FIELDS:
        return "unknown", "the parser does not know it"
    return flag_status(FIELDS[flag])


def naming_test(flag: str) -> str | None:
    """The first test file that names `flag` (as a flag or as its config field)."""
    field = FIELDS[flag].name if flag in FIELDS else None
    pattern = re.compile(re.escape(flag) + r"(?![\w-])" + (rf"|\b{field}\b" if field else ""))
    return next((path for path, text in sorted(TESTS.items()) if pattern.search(text)), None)


def unbuilt() -> set[str]:
    return {f for f in REFERENCE if status(f)[0] in ("not built", "unknown")
            or f.startswith("--sglang-") and f not in PASSTHROUGH and f not in FIELDS}


def test_the_snapshot_is_the_seeds_reference():
    assert len(REFERENCE) == len(set(REFERENCE)) == 268
    if SEED.is_file():
        seeds = re.findall(r"^(--[a-z0-9-]+) \|", SEED.read_text(), re.M)
        assert seeds == REFERENCE, "the seeds changed: python3 tests/unit/config/test_reference_flags.py --regenerate"


def test_still_unbuilt_only_shrinks():
    now = unbuilt()
    assert not now - STILL_UNBUILT, f"newly unbuilt (a regression): {sorted(now - STILL_UNBUILT)}"
    assert not STILL_UNBUILT - now, f"built now: take them off STILL_UNBUILT: {sorted(STILL_UNBUILT - now)}"


@pytest.mark.parametrize("flag", [f for f in REFERENCE if f not in STILL_UNBUILT])
def test_every_other_flag_acts_with_a_test_or_says_why_not(flag):
    kind, reason = status(flag)
    if kind in ("acts", "megatron"):
        test = naming_test(flag)
        if flag in ACTS_WITHOUT_TEST:
            assert test is None, f"{flag} is named by {test} now: take it off ACTS_WITHOUT_TEST"
        else:
            assert test, f"{flag} acts but no test names it"
    else:
        assert kind in ("needs", "no effect") and reason, (flag, kind, reason)
    if kind == "needs":
        assert re.search(r"needs .*(transformers|Transformer Engine|GPU|install)", reason), reason


def table() -> list[str]:
    rows = []
    for flag in REFERENCE:
        kind, reason = status(flag)
        test = naming_test(flag) if kind in ("acts", "megatron") else ""
        rows.append(f"{flag:<46} {kind:<10} {test or reason}")
    return rows


def regenerate() -> None:
    rows = re.findall(r"^(--[a-z0-9-]+) \| ([^|]+?) \|", SEED.read_text(), re.M)
    head = [line for line in SNAPSHOT.read_text().splitlines() if line.startswith("#")]
    SNAPSHOT.write_text("\n".join(head) + "\n" + "".join(f"{f}\t{t.strip()}\n" for f, t in rows))


if __name__ == "__main__":
    if "--regenerate" in sys.argv:
        regenerate()
    print("\n".join(table()))
