"""Audit heatmaps: one PNG per attention kernel, drawn from the JSON payload alone.

Padded layout: per-sequence decode is one row of KV-block rungs; batched decode is num_seqs
by KV blocks, one panel per dispatchable flag pair. Ragged layout: the per-sequence kernel is
query rungs by KV blocks; the batched kernel is num_seqs by KV blocks, each cell the chunked
key that pair realises (two pairs can share one). matplotlib is the optional `plot`
extra: it is imported here, lazily, through the Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runtime.bucketer import ATTEND, BATCHED, CHUNKED, DECODE
from spyre_verify.audit.verdict import HIT, MISSED, NEVER_HIT, PRUNED
from spyre_verify.oracle.derive import DEFAULT_ENTRIES

CATEGORIES = (HIT, NEVER_HIT, PRUNED, MISSED)
COLOURS = {HIT: "#4caf50", NEVER_HIT: "#ffb300", PRUNED: "#d9d9d9", MISSED: "#e53935"}
LABELS = {HIT: "warmed and hit", NEVER_HIT: "warmed, never hit", PRUNED: "pruned", MISSED: "missed"}
# The only two flag pairs dispatch produces: store_out is exactly not needs_gather.
BATCHED_PANELS = ((False, True, "every row real (store_out)"), (True, False, "padded rows (needs_gather)"))

Panel = tuple[str, list[str], list[list[tuple[str, str]]]]  # title, row labels, cells (category, text)


def _cell(rows: dict[tuple[Any, ...], dict[str, Any]], key: tuple[Any, ...]) -> tuple[str, str]:
    r = rows.get(key)
    if r is None:
        return PRUNED, "pruned"
    late = r["compile_seconds_after_warmup"]
    secs = (
        f"{r['compile_seconds']:.2f} s"
        if r["compile_seconds"] is not None
        else f"{late:.2f} s late"
        if late
        else "no graph"
    )
    note = f"{r['own_hits']} hits" if r["status"] in ("hit", "extra") else r["status"]
    return r["category"], f"{secs}\n{note}"


def _axis(p: dict[str, Any], name: str) -> list[int]:
    """One axis: the rungs of the runtime's and the contract's ladders, plus any a bucket
    row uses, so a bucket off either ladder still gets a cell."""
    rungs = {*p["ladders"].get(name, []), *p.get("expected_ladders", {}).get(name, [])}
    for b in p["buckets"]:
        if b["kernel"] == BATCHED:
            rungs.add(b["key"][0 if name == "num_seqs" else 1])
        elif b["kernel"] in (DECODE, ATTEND) and name == "kv_blocks":
            rungs.add(b["key"][0])
        elif b["kernel"] == ATTEND and name == "query_tokens":
            rungs.add(b["key"][1])
    return sorted(rungs)


def chunked_cell(entries: int, seqs: int, kv: int) -> tuple[int, int, int]:
    """DESIGN's chunked key of a (num_seqs rung, KV rung) pair."""
    per_chunk = max(1, min(entries // seqs, kv))
    return seqs, per_chunk, -(-kv // per_chunk)


def panels(p: dict[str, Any], kernel: str) -> list[Panel]:
    """The grid(s) of one decode kernel; empty when its ladder has no rung."""
    kv, seqs = _axis(p, "kv_blocks"), _axis(p, "num_seqs")
    rows = {tuple(b["key"]): b for b in p["buckets"] if b["kernel"] == kernel}
    if kernel == DECODE:
        return [("per-sequence decode", ["per-seq"], [[_cell(rows, (k,)) for k in kv]])] if kv else []
    if kernel == ATTEND:
        qs = _axis(p, "query_tokens")
        cells = [[_cell(rows, (k, q)) for k in kv] for q in qs]
        return [("per-sequence attention", [f"query {q}" for q in qs], cells)] if kv and qs else []
    if not kv or not seqs:
        return []
    if kernel == CHUNKED:
        entries = p["config"].get("batched_decode_entries") or DEFAULT_ENTRIES
        cells = [[_cell(rows, chunked_cell(entries, n, k)) for k in kv] for n in seqs]
        return [("batched decode, chunked", [f"{n} seqs" for n in seqs], cells)]
    return [
        (title, [f"{n} seqs" for n in seqs], [[_cell(rows, (n, k, ng, so)) for k in kv] for n in seqs])
        for ng, so, title in BATCHED_PANELS
    ]


def draw(p: dict[str, Any], kernel: str, path: Path) -> Path | None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    grids = panels(p, kernel)
    if not grids:
        return None
    kv = _axis(p, "kv_blocks")
    height = len(grids[0][1])
    fig = Figure(figsize=(max(4.0, 1.3 * len(kv) + 1.5) * len(grids), 1.0 * height + 2.4))
    FigureCanvasAgg(fig)
    cmap = ListedColormap([COLOURS[c] for c in CATEGORIES])
    axes = fig.subplots(1, len(grids), squeeze=False)[0]
    for ax, (title, ylabels, cells) in zip(axes, grids, strict=True):
        codes = [[CATEGORIES.index(cat) for cat, _ in row] for row in cells]
        ax.imshow(codes, cmap=cmap, vmin=-0.5, vmax=len(CATEGORIES) - 0.5, aspect="auto")
        for y, row in enumerate(cells):
            for x, (_, text) in enumerate(row):
                ax.text(x, y, text, ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(kv)), [str(k) for k in kv])
        ax.set_yticks(range(len(ylabels)), ylabels)
        # White lines between cells, so neighbours of one colour still read as separate buckets.
        ax.set_xticks([x - 0.5 for x in range(len(kv) + 1)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(len(ylabels) + 1)], minor=True)
        ax.grid(which="minor", color="white", linewidth=2)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("KV blocks (rung)")
        ax.set_title(title, fontsize=10)
    c, e = p["config"], p["environment"]
    fig.suptitle(
        f"{kernel} kernel: audit {p['verdict'].upper()}{' under ' + p['fault'] if p['fault'] else ''}\n"
        f"bs={c['block_size']} L={c['max_model_len']} seqs={c['max_num_seqs']} pool={c['total_blocks']}, "
        f"{e['backend']} on {e['device']}",
        fontsize=10,
    )
    handles = [Patch(color=COLOURS[c], label=LABELS[c]) for c in CATEGORIES]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")  # atomic like every report: a reader never sees half a PNG
    fig.savefig(tmp, dpi=110, format="png")
    os.replace(tmp, path)
    return path


def write_heatmaps(p: dict[str, Any], out: Path, stem: str) -> list[Path] | None:
    """One PNG per decode kernel; None when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401  # the optional `plot` extra
    except ImportError:
        return None
    kernels = (ATTEND, CHUNKED) if p["config"].get("layout") == "ragged" else (DECODE, BATCHED)
    written = [draw(p, kernel, out / f"{stem}-{kernel}.png") for kernel in kernels]
    return [w for w in written if w is not None]
