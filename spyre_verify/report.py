"""Reports: written atomically (temp file, fsync, rename), read back with JSON only."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from runtime.config import ModelDims, RuntimeConfig

SCHEMA_VERSION = 1
DEFAULT_DIR = Path("reports")


def write_atomic(path: Path, text: str) -> Path:
    """Replace `path` with `text` so a reader sees the old file or the new one, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # mkstemp makes the file private (0600); a report gets the usual 0644 instead.
            os.fchmod(f.fileno(), 0o644)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    assert payload.get("schema_version") == SCHEMA_VERSION, "every JSON report carries schema_version"
    return write_atomic(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "schema_version" not in data:
        raise ValueError(f"{path}: not a spyre-verify report (no schema_version)")
    return data


def environment(device: str, backend: str) -> dict[str, Any]:
    import torch  # here, not at the top: the CLI answers a bad flag before torch loads

    name = (
        torch.cuda.get_device_name(0)
        if device.startswith("cuda") and torch.cuda.is_available()
        else platform.processor() or platform.machine()
    )
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
        "device_name": name,
        "backend": backend,
    }


def config_payload(c: RuntimeConfig) -> dict[str, Any]:
    """Every config field as JSON, as given (so that `config_of` reads back the same config), plus
    the pool size, the env that reproduces it and, for a ragged config, `resolved`: its step budget
    and entry target in force, defaults included (the runtime received them so)."""
    d = dataclasses.asdict(c)
    d["kv_buckets"] = list(c.kv_buckets) if c.kv_buckets else None
    d["query_buckets"] = list(c.query_buckets) if c.query_buckets else None
    resolved = {"max_num_batched_tokens": c.token_budget, "batched_decode_entries": c.decode_entries}
    d["resolved"] = {**resolved, "min_batched_seqs": c.batched_from} if c.ragged else None
    d["total_blocks"], d["env_overrides"] = c.total_blocks, c.env_overrides()
    return d


def layout_words(c: dict[str, Any]) -> str:
    """A config payload's layout settings as a report's Config line names them: "" for padded."""
    if c.get("layout", "padded") != "ragged":
        return ""
    shown = c.get("resolved") or c  # the values in force; an older report holds null for a default
    words = (
        f"{k}={shown[k] if shown.get(k) is not None else 'default'}"
        for k in ("max_num_batched_tokens", "batched_decode_entries")
    )
    query = f" query_buckets={','.join(map(str, c['query_buckets']))}" if c.get("query_buckets") else ""
    return f" layout=ragged {' '.join(words)}{query}"


def config_words(c: dict[str, Any]) -> str:
    """A fault row's config (`controls.run_config`) in one cell: 'block_size=4 max_model_len=16 ...'."""
    return " ".join(f"{k}={v}" for k, v in c.items()) or "-"


def md_title(kind: str, verdict: str, fault: str | None) -> list[str]:
    lines = [f"# spyre-verify {kind}: {verdict.upper()}", ""]
    return [*lines, f"Run under the seeded fault `{fault}`.", ""] if fault else lines


CELL_WIDTH = 100  # a longer cell wraps onto continuation rows


def _wrapped(row: list[str], width: int) -> list[list[str]]:
    """One table row as one or more: a long cell wraps between words onto the rows below it, with
    the other cells left blank there, so a message is never cut and the table stays valid Markdown."""
    wrap = textwrap.TextWrapper(width, break_long_words=False, break_on_hyphens=False)
    cells = [[t.replace("|", "\\|") for t in wrap.wrap(str(x))] or [""] for x in row]
    return [[c[i] if i < len(c) else "" for c in cells] for i in range(max(map(len, cells)))]


def table(rows: list[list[str]], header: list[str], width: int = CELL_WIDTH) -> str:
    """A Markdown table; also readable as plain text on a terminal. Cells longer than `width` wrap."""
    body = [r for row in rows for r in _wrapped(row, width)]
    widths = [max(len(x) for x in col) for col in zip(header, *body, strict=False)]
    line = lambda r: "| " + " | ".join(x.ljust(w) for x, w in zip(r, widths, strict=False)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, body)])


def config_of(payload: dict[str, Any]) -> RuntimeConfig:
    """The inverse of `report.config_payload`: every field back to its Python type."""
    kwargs = {f.name: payload[f.name] for f in dataclasses.fields(RuntimeConfig)}
    kwargs["model"] = ModelDims(**kwargs["model"])
    kwargs["kv_buckets"] = tuple(kwargs["kv_buckets"]) if kwargs["kv_buckets"] is not None else None
    kwargs["query_buckets"] = tuple(kwargs["query_buckets"]) if kwargs["query_buckets"] is not None else None
    return RuntimeConfig(**kwargs)
