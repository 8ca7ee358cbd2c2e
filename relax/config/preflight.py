"""Input checks that read files, run by `relax-train` after the flags validate and before Ray
starts: a bad input fails in a second, not after every role has started.

- Data: every `--prompt-data` and eval file is read, each row parsed and its keys checked, up
  to `FULL_CHECK_BYTES` per file (the rest is checked as it streams in, with the same per-row
  errors naming file, line and column). Bad rows are listed together; `--skip-malformed-rows`
  turns them into a warning with a count.
- Checkpoints: `--save` (and the run directory) can be written and has room for a checkpoint;
  `--load` holds a complete checkpoint to resume from (relax.utils.checkpoints).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from relax.config.eval_config import eval_datasets
from relax.config.errors import ConfigError
from relax.config.schema import RelaxConfig
from relax.utils.checkpoints import CheckpointError, resume_point
from relax.utils.data.formatting import PromptFormat, build_sample
from relax.utils.data.readers import DataError, iter_records, resolve_prompt_paths

logger = logging.getLogger(__name__)

FULL_CHECK_BYTES = 64 << 20  # rows of a file read and checked before the run starts
SHOWN_ERRORS = 5
# A checkpoint holds the weights, and with the optimizer two Adam moments (fp32 each).
CKPT_SIZE_FACTOR = {True: 3.0, False: 1.0}


def check_inputs(cfg: RelaxConfig) -> None:
    """Every check of this module; raises ConfigError naming the input and the fix."""
    check_data(cfg)
    check_writable(cfg)
    check_resume(cfg)


# ---- data ------------------------------------------------------------------------------------

def check_data(cfg: RelaxConfig) -> None:
    d = cfg.data
    if not cfg.debug.load_debug_rollout_data:  # replayed rollouts need no prompts
        fmt = PromptFormat(input_key=d.input_key, label_key=d.label_key, metadata_key=d.metadata_key,
                           tool_key=d.tool_key, multimodal_keys=d.multimodal_keys)
        for path in resolve_prompt_paths(d.prompt_data):
            check_rows(path, fmt, "--prompt-data", skip_malformed=d.skip_malformed_rows)
    for ds in eval_datasets(cfg.args):
        fmt = PromptFormat(input_key=ds.input_key, label_key=ds.label_key, metadata_key=ds.metadata_key,
                           tool_key=ds.tool_key, multimodal_keys=d.multimodal_keys)
        source = f"eval set {ds.name!r}"
        for path in resolve_prompt_paths(ds.path, flag=source):
            check_rows(path, fmt, source, skip_malformed=d.skip_malformed_rows)


def check_rows(path: str, fmt: PromptFormat, flag: str, *, skip_malformed: bool = False,
               limit_bytes: int = FULL_CHECK_BYTES) -> int:
    """Parse the rows of one file (up to `limit_bytes`) as the data source will; returns how many
    were read. Raises ConfigError listing the bad rows (a warning with --skip-malformed-rows)."""
    real = path.split("@[")[0]
    if os.path.isfile(real) and os.path.getsize(real) == 0:
        raise ConfigError(f"{flag} {real}: the file is empty; point {flag} at the prompts")
    budget = limit_bytes
    rows, bad, errors = 0, 0, []
    try:
        for location, row in iter_records(path, flag=flag):
            if isinstance(row, DataError):
                error: DataError | None = row
            else:
                try:
                    build_sample(row, location, fmt, tokenizer=None)
                    error = None
                except DataError as exc:
                    error = exc
            rows += 1
            if error is not None:
                bad += 1
                if len(errors) < SHOWN_ERRORS:
                    errors.append(str(error))
            budget -= _row_bytes(row)
            if budget <= 0:
                logger.info("%s %s: checked the first %d rows before the run; the rest is checked as it is read",
                            flag, real, rows)
                break
    except (OSError, ValueError) as exc:  # a missing or unreadable file, a parquet that does not open
        raise ConfigError(f"{flag} {real}: {exc}") from exc
    if rows == 0:
        raise ConfigError(f"{flag} {path}: no rows (only blank lines, or an empty slice); point {flag} at the prompts")
    if bad and (not skip_malformed or bad == rows):
        more = f" (first {len(errors)} shown)" if bad > len(errors) else ""
        fix = "fix the rows or pass --skip-malformed-rows to skip and count them" if bad < rows else \
            "no row is usable: check --input-key / --label-key against the file's columns"
        raise ConfigError(f"{flag} {real}: {bad} of {rows} rows checked are malformed{more}:\n  "
                          + "\n  ".join(errors) + f"\n{fix}")
    if bad:
        logger.warning("%s %s: %d of %d rows checked are malformed and will be skipped (--skip-malformed-rows); "
                       "first: %s", flag, real, bad, rows, errors[0])
    return rows


def _row_bytes(row: Any) -> int:
    return len(str(row)) if not isinstance(row, DataError) else 64


# ---- checkpoints -----------------------------------------------------------------------------

def checkpoint_bytes(cfg: RelaxConfig) -> int:
    """About how much one checkpoint takes: the HF weights, times 3 with the optimizer state."""
    weights = sum(p.stat().st_size for p in Path(cfg.ckpt.hf_checkpoint).glob("*")
                  if p.suffix in (".safetensors", ".bin", ".pt") and p.is_file())
    # (fp32 master weights: bf16 files count double)
    return int(weights * CKPT_SIZE_FACTOR[not cfg.ckpt.no_save_optim] * (2 if cfg.optim.bf16 else 1))


def _probe_writable(directory: str, flag: str) -> str:
    """Raise unless `directory` can be written (or created: its nearest existing ancestor must be a
    writable directory; nothing is created here). Returns the directory that exists."""
    existing = os.path.abspath(directory)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    try:
        if not os.path.isdir(existing):
            raise NotADirectoryError(20, "Not a directory")
        if existing == os.path.abspath(directory):
            with tempfile.NamedTemporaryFile(dir=existing, prefix=".relax-write-check-"):
                pass
        elif not os.access(existing, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as exc:
        raise ConfigError(f"{flag} {directory}: cannot write there ({exc.strerror} at {existing}); choose a "
                          "directory this user can write") from exc
    return existing


def check_writable(cfg: RelaxConfig) -> None:
    _probe_writable(cfg.misc.exp_dir, "--exp-dir")
    if not cfg.ckpt.save:
        return
    existing = _probe_writable(cfg.ckpt.save, "--save")
    need, free = checkpoint_bytes(cfg), shutil.disk_usage(existing).free
    if need > free:
        raise ConfigError(f"--save {cfg.ckpt.save}: one checkpoint needs about {need / 2**30:.1f} GiB and only "
                          f"{free / 2**30:.1f} GiB is free there; free space, save elsewhere, or pass "
                          "--no-save-optim (weights only)")


def check_resume(cfg: RelaxConfig) -> None:
    if not cfg.ckpt.load:
        return
    try:
        point = resume_point(cfg.ckpt.load, fallback=cfg.ckpt.load_fallback)
    except CheckpointError as exc:
        raise ConfigError(str(exc)) from exc
    if point is None:
        logger.info("--load %s holds no checkpoint yet: the run starts from --hf-checkpoint", cfg.ckpt.load)
    else:
        logger.info("resuming from the checkpoint of step %d under %s", point.rollout_id, cfg.ckpt.load)
