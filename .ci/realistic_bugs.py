"""How many realistic runtime bugs do the user-facing tools catch? A held-out-style bug set.

    python .ci/realistic_bugs.py [--only NAME ...] [--jobs 1] [--json PATH] [--baseline] [--list]

Each bug is a textual edit to a file under runtime/, written the way a developer would
get it wrong, with no seam. For every bug the repository's files (tracked, plus
untracked ones git does not ignore) are copied to a temp dir, the edit is applied
there, and the tools a user runs are run on that copy, with `PYTHONPATH` pointing at it
(a probe checks that `runtime` and `spyre_verify` resolve to the copy, not to the
editable install):

    python -m spyre_verify check --no-controls
    python -m spyre_verify hunt --examples 300 --seed 0

A bug is caught when either exits 1. Exit 3 (the harness crashed) and exit 2 (usage
error) are not catches; exit 0 is an escape. The table and the catch rate are printed,
and written as JSON with --json. `--baseline` first runs the unmodified tree, which
must pass both tools, or every catch below is noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300
CAUGHT = 1


@dataclass(frozen=True)
class Bug:
    name: str
    file: str  # under runtime/
    edits: tuple[tuple[str, str], ...]  # (old, new); each old occurs exactly once in the file
    description: str
    kind: str  # the escape class it stands for
    # `check` flags that make the bug observable (e.g. a size flag, so the runtime's default pool is used).
    check_args: tuple[str, ...] = ()
    # The violation kind `check --no-controls` must name (tests/verify/test_seeded_runtime_bugs.py); "" if unpinned.
    expect: str = ""


def bug(
    name: str,
    file: str,
    old: str,
    new: str,
    description: str,
    kind: str,
    check_args: tuple[str, ...] = (),
    expect: str = "",
) -> Bug:
    return Bug(name, file, ((old, new),), description, kind, check_args, expect)


SCHED = "scheduling"
PADROW = "padded-rows"
BOUND = "pool/pruning bound"
LADDER = "ladder maths"
CONFIG = "config/env parsing"
META = "metadata builder"
KERNEL = "kernel masks"
ENGINE = "engine"
WORD = "the runtime's own word"

# Retired as equivalent once the config refused a KV override out of order ("never re-sorted"):
# `kv-ladder-env-unsorted` (the ladder used in the order given) and `kv-buckets-top-is-last` (the
# top-rung rule reading the last bucket). Every list those edits can see is already increasing,
# so neither can change what the runtime does, and no tool could catch them.
BUGS: list[Bug] = [
    # -- scheduling decisions: no bucket and no token need change --------------------------------
    bug(
        "strip-one-step-late",
        "runtime/scheduler.py",
        "        done = []\n"
        "        for r, t in zip(list(rows), tokens, strict=True):\n"
        "            r.output.append(t)\n"
        "            reason = self.finish_reason(r)\n"
        "            if reason is not None:\n"
        "                self._end(r, reason)\n"
        "                done.append(r)\n"
        "        if plan.admission is None:\n"
        "            self.tkv += 1  # every decoded row cached one more token\n"
        "        self._strip()\n",
        "        done = []\n"
        "        self._strip()\n"
        "        for r, t in zip(list(rows), tokens, strict=True):\n"
        "            r.output.append(t)\n"
        "            reason = self.finish_reason(r)\n"
        "            if reason is not None:\n"
        "                self._end(r, reason)\n"
        "                done.append(r)\n"
        "        if plan.admission is None:\n"
        "            self.tkv += 1  # every decoded row cached one more token\n",
        "strip runs before the finished rows leave, so their padding is only dropped a step later",
        SCHED,
    ),
    bug(
        "strip-one-block-only",
        "runtime/scheduler.py",
        "            for r in self.running:\n"
        "                r.left_pad -= k * self.bs\n"
        "            self.tkv -= k * self.bs\n",
        "            for r in self.running:\n                r.left_pad -= self.bs\n            self.tkv -= self.bs\n",
        "strip drops one leading block per step even when every row has k >= 2 padding blocks",
        SCHED,
    ),
    bug(
        "finish-one-token-early",
        "runtime/requests.py",
        '        return "length" if r.remaining == 0 else None\n',
        '        return "length" if r.remaining <= 1 else None\n',
        "a request ends when one token is still to come (the in-flight token is counted as generated)",
        SCHED,
    ),
    bug(
        "finish-one-token-late",
        "runtime/requests.py",
        '        return "length" if r.remaining == 0 else None\n',
        '        return "length" if r.remaining < 0 else None\n',
        "a request ends one token after max_tokens",
        SCHED,
    ),
    bug(
        "reserve-one-block-too-many",
        "runtime/scheduler.py",
        "        need = ceil_div(tkv + req.max_tokens - 1, bs) - lp // bs\n",
        "        need = ceil_div(tkv + req.max_tokens, bs) - lp // bs\n",
        "admission reserves room for max_tokens cached tokens, one more than the last token needs",
        SCHED,
    ),
    bug(
        "reserve-one-block-too-few",
        "runtime/scheduler.py",
        "        need = ceil_div(tkv + req.max_tokens - 1, bs) - lp // bs\n",
        "        need = ceil_div(tkv + req.max_tokens - 2, bs) - lp // bs\n",
        "admission forgets the block the last cached token starts",
        SCHED,
    ),
    bug(
        "shift-one-block-too-far",
        "runtime/scheduler.py",
        "            shift = ceil_div(p - self.tkv, bs) * bs if p > self.tkv else 0\n",
        "            shift = ((p - self.tkv) // bs + 1) * bs if p > self.tkv else 0\n",
        "shift rounds up with floor+1, a whole extra block when p - tkv is a block multiple",
        SCHED,
    ),
    bug(
        "admission-ignores-running-rows",
        "runtime/scheduler.py",
        "        if tkv + req.max_tokens > L or any(tkv + r.remaining > L for r in self.running):\n",
        "        if tkv + req.max_tokens > L:\n",
        "admission checks only the joiner against max_model_len, not the running rows a shift pushes right",
        SCHED,
    ),
    Bug(
        "admission-shortest-first",
        "runtime/scheduler.py",
        (
            ("        req = self.waiting[0]\n", "        req = min(self.waiting, key=lambda w: len(w.prompt))\n"),
            (
                "        req = self.waiting.popleft()\n        assert req is adm.request\n",
                "        req = adm.request\n        self.waiting.remove(req)\n",
            ),
        ),
        "admission takes the shortest waiting prompt first (keeps tkv low) instead of arrival order",
        SCHED,
    ),
    bug(
        "grow-one-token-early",
        "runtime/scheduler.py",
        "            need = self.tkv // self.bs - r.left_pad // self.bs + 1\n",
        "            need = (self.tkv + 1) // self.bs - r.left_pad // self.bs + 1\n",
        "decode allocates the next block one token before the token that lands in it",
        SCHED,
    ),
    bug(
        "fit-check-ignores-prompt-padding",
        "runtime/scheduler.py",
        "        if padded + max_tokens > self.config.max_model_len:\n",
        "        if len(tokens) + max_tokens > self.config.max_model_len:\n",
        "add_request accepts a request that only fits unpadded; it can never be admitted",
        SCHED,
    ),
    bug(
        "request-accepts-zero-max-tokens",
        "runtime/requests.py",
        "        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:\n",
        "        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:\n",
        "add_request accepts max_tokens=0 (the bound is written as non-negative)",
        SCHED,
    ),
    # -- padded rows and entries of a block table --------------------------------------------------
    bug(
        "padded-rows-copy-row-0",
        "runtime/blocks.py",
        "    rows += [(pad,) * width] * (count - len(rows))\n",
        "    rows += [rows[0]] * (count - len(rows))\n",
        "padded rows of a batched table repeat the first real row (its live blocks)",
        PADROW,
    ),
    bug(
        "padded-rows-copy-last-row",
        "runtime/blocks.py",
        "    rows += [(pad,) * width] * (count - len(rows))\n",
        "    rows += [rows[-1]] * (count - len(rows))\n",
        "padded rows of a batched table repeat the last real row (its live blocks)",
        PADROW,
    ),
    bug(
        "row-tail-repeats-last-block",
        "runtime/blocks.py",
        "    return entries + (pad,) * (width - len(entries))\n",
        "    return entries + entries[-1:] * (width - len(entries))\n",
        "a real row is padded to the bucket width with its own last block instead of the null block",
        PADROW,
    ),
    # -- pool and pruning bounds -------------------------------------------------------------------------
    bug(
        "pool-refuses-exact-fit",
        "runtime/block_pool.py",
        "        return 0 <= n <= self.num_free\n",
        "        return 0 <= n < self.num_free\n",
        "a reservation that takes the last free block is refused",
        BOUND,
    ),
    bug(
        "pool-loses-last-block",
        "runtime/block_pool.py",
        "        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))",
        "        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks - 1))",
        "the free list skips the null block and the last block too",
        BOUND,
    ),
    bug(
        "pool-first-draw-eats-reservation",
        "runtime/block_pool.py",
        "        from_reservation = min(n, self._reserved.get(owner, 0))\n",
        "        from_reservation = self._reserved.get(owner, 0)\n",
        "the first allocation consumes the whole reservation, so later growth is unreserved",
        BOUND,
    ),
    bug(
        "pool-override-forgets-null-block",
        "runtime/config.py",
        '    ("num_blocks", lambda v, c: v >= c.max_blocks_per_seq + 1,\n',
        '    ("num_blocks", lambda v, c: v >= c.max_blocks_per_seq,\n',
        "a num_blocks override one block too small (no room for the null block) is accepted",
        BOUND,
    ),
    bug(
        "pool-override-refuses-minimum",
        "runtime/config.py",
        '    ("num_blocks", lambda v, c: v >= c.max_blocks_per_seq + 1,\n',
        '    ("num_blocks", lambda v, c: v > c.max_blocks_per_seq + 1,\n',
        "the smallest valid num_blocks override is refused",
        BOUND,
    ),
    bug(
        "prune-decode-tkv-to-L-1",
        "runtime/reachability.py",
        "    return [(blocks + (seqs - 1) * (blocks - (t - 1) // bs), seqs * (t + 1)) for t in tkvs if t <= L - 2]\n",
        "    return [(blocks + (seqs - 1) * (blocks - (t - 1) // bs), seqs * (t + 1)) for t in tkvs if t <= L - 1]\n",
        "decode reachability lets tkv run to L - 1: the top KV rung is kept when max_model_len = 1 mod block_size",
        BOUND,
    ),
    bug(
        "prune-decode-other-rows-one-block",
        "runtime/reachability.py",
        "    return [(blocks + (seqs - 1) * (blocks - (t - 1) // bs), seqs * (t + 1)) for t in tkvs if t <= L - 2]\n",
        "    return [(blocks + (seqs - 1) * (blocks - t // bs), seqs * (t + 1)) for t in tkvs if t <= L - 2]\n",
        "the other rows' minimum blocks ignore the block a tkv on a block boundary starts",
        BOUND,
    ),
    bug(
        "prune-prefill-join-pool-one-less",
        "runtime/reachability.py",
        "        out.append((t // bs + 2, t + 1))  # joins a running batch\n",
        "        out.append((t // bs + 1, t + 1))  # joins a running batch\n",
        "a prefill joining a running batch is thought to need one block less, so tight pools warm extra",
        BOUND,
    ),
    bug(
        "prune-rung-includes-rung-below",
        "runtime/bucketer.py",
        "        return range(ladders.rung_below(self.kv_blocks, kv) + 1, kv + 1)\n",
        "        return range(ladders.rung_below(self.kv_blocks, kv), kv + 1)\n",
        "a KV rung's members start at the rung below instead of one above it",
        BOUND,
    ),
    bug(
        "prune-seqs-floor-zero",
        "runtime/bucketer.py",
        "            low = ladders.rung_below(self.num_seqs, n, self.config.batched_from - 1)\n",
        "            low = ladders.rung_below(self.num_seqs, n)\n",
        "the lowest seqs rung's members start at 1, so batched needs_gather buckets of rung 2 are warmed",
        BOUND,
    ),
    # -- ladder maths ------------------------------------------------------------------------------------
    bug(
        "kv-ladder-top-floor",
        "runtime/ladders.py",
        "    return powers_of_two_up_to(ceil_div(max_model_len, block_size))\n",
        "    return powers_of_two_up_to(max_model_len // block_size)\n",
        "the default KV ladder's top rung rounds down when max_model_len is not a block multiple",
        LADDER,
    ),
    bug(
        "ladder-drops-single-rung",
        "runtime/ladders.py",
        "    if top >= start:\n",
        "    if top > start:\n",
        "a ladder whose top equals its start is empty (max_num_seqs=2: no batched decode)",
        LADDER,
    ),
    # -- config and env parsing -----------------------------------------------------------------------
    bug(
        "flag-zero-is-true",
        "runtime/env.py",
        '        return text.strip() == "1"\n',
        "        return bool(text.strip())\n",
        "SPYRE_BATCHED_DECODE=0 parses as True (bool of a non-empty string)",
        CONFIG,
    ),
    bug(
        "kv-buckets-no-whitespace",
        "runtime/env.py",
        '    parts = [p.strip() for p in text.split(",")]\n',
        '    parts = text.split(",")\n',
        "SPYRE_ATTN_KV_BUCKETS='64, 128' is refused: parts are not stripped",
        CONFIG,
    ),
    bug(
        "kv-bucket-above-unrounded-L",
        "runtime/config.py",
        '    ("kv_buckets[]", lambda v, c: v <= _top(c),\n',
        '    ("kv_buckets[]", lambda v, c: v <= c.max_model_len,\n',
        "a bucket equal to max_model_len rounded up to a block is refused (L not a block multiple)",
        CONFIG,
    ),
    bug(
        "block-size-odd-check",
        "runtime/config.py",
        '    ("block_size", lambda v, c: not v & (v - 1), "must be a power of two (1, 2, 4, 8, ...)"),\n',
        '    ("block_size", lambda v, c: v % 2 == 0, "must be a power of two (1, 2, 4, 8, ...)"),\n',
        "the power-of-two rule is an evenness test: block_size 6 accepted, 1 refused",
        CONFIG,
    ),
    bug(
        "env-empty-value-refused",
        "runtime/config.py",
        '        env = {name: env[name] for name in ENV_VARIABLES if env.get(name, "") != ""}\n',
        "        env = {name: env[name] for name in ENV_VARIABLES if name in env}\n",
        "a SPYRE_* variable set to the empty string is parsed (and refused) instead of counting as unset",
        CONFIG,
    ),
    bug(
        "env-flag-does-not-override",
        "runtime/config.py",
        '            kwargs["batched_decode"] = parse_flag(env[ENV_BATCHED_DECODE], ENV_BATCHED_DECODE)\n',
        '            kwargs.setdefault("batched_decode", parse_flag(env[ENV_BATCHED_DECODE], ENV_BATCHED_DECODE))\n',
        "SPYRE_BATCHED_DECODE loses to an explicit batched_decode argument",
        CONFIG,
    ),
    bug(
        "env-backend-does-not-override",
        "runtime/config.py",
        '            kwargs["backend"] = parse_backend(env[ENV_BACKEND], ENV_BACKEND)\n',
        '            kwargs.setdefault("backend", parse_backend(env[ENV_BACKEND], ENV_BACKEND))\n',
        "SPYRE_DYNAMO_BACKEND loses to an explicit backend argument",
        CONFIG,
    ),
    # -- metadata builder: slots, left pad, widths -------------------------------------------------------
    bug(
        "row-lead-rounds-up",
        "runtime/metadata.py",
        "        lead = seq.left_pad // self.block_size\n",
        "        lead = -(-seq.left_pad // self.block_size)\n",
        "a partly padded first block counts as a padding block in the table",
        META,
    ),
    bug(
        "slot-from-unaligned-offset",
        "runtime/metadata.py",
        "        first = seq.left_pad // self.block_size * self.block_size\n",
        "        first = seq.left_pad\n",
        "KV slots index the row's blocks by offset from the left pad, not by block boundary",
        META,
    ),
    bug(
        "decode-left-pads-block-aligned",
        "runtime/metadata.py",
        "            left_pads=tuple(s.left_pad for s in seqs),\n",
        "            left_pads=tuple(s.left_pad // self.block_size * self.block_size for s in seqs),\n",
        "decode metadata reports left padding rounded down to a block, so the mask lets in padding",
        META,
    ),
    # -- kernel masks ------------------------------------------------------------------------------------
    bug(
        "decode-mask-excludes-new-token",
        "runtime/attention.py",
        "    keep = pos <= tkv.reshape(1, 1, 1, 1)\n",
        "    keep = pos < tkv.reshape(1, 1, 1, 1)\n",
        "decode attention stops before position tkv, the token it just wrote",
        KERNEL,
    ),
    bug(
        "prefill-mask-drops-first-token",
        "runtime/attention.py",
        "        first = torch.minimum(pos, left_pad.reshape(1)) if mask_padding else torch.zeros_like(pos)\n",
        "        first = torch.minimum(pos, left_pad.reshape(1) + 1) if mask_padding else torch.zeros_like(pos)\n",
        "prefill masks the first real token as if it were padding",
        KERNEL,
    ),
    bug(
        "per-seq-decode-row-0-left-pad",
        "runtime/paged_attention.py",
        "                st.seq_left_pad.copy_(st.left_pads[i : i + 1])\n",
        "                st.seq_left_pad.copy_(st.left_pads[0:1])\n",
        "the per-sequence decode loop masks every row with row 0's left padding (copy-paste of the first row)",
        KERNEL,
    ),
    # -- engine ------------------------------------------------------------------------------------------
    bug(
        "decode-positions-use-tkv",
        "runtime/engine.py",
        "        x = self._forward(md, list(plan.inputs), [r.num_cached for r in plan.rows])\n",
        "        x = self._forward(md, list(plan.inputs), [md.tkv for _ in plan.rows])\n",
        "decode embeds every row at the batch position tkv instead of its own position",
        ENGINE,
    ),
    bug(
        "prefill-logits-from-last-padded-position",
        "runtime/engine.py",
        "        return self._pick((md.request_id,), self.model.logits(x[tkv - 1 : tkv]))\n",
        "        return self._pick((md.request_id,), self.model.logits(x[-1:]))\n",
        "prefill samples from the last padded position, wrong when a join is right-padded",
        ENGINE,
    ),
    # -- what the runtime reports about itself: counts, labels, config values, refusals ------------
    bug(
        "one-row-decode-bypasses-runner",
        "runtime/paged_attention.py",
        "                rows.append(run(md.bucket, *args).clone())\n",
        "                rows.append(attention.make_decode()(*args).clone())\n",
        "per-sequence decode calls the attention function directly, not its compiled runner: "
        "served eagerly, and neither of the runner's counters moves",
        WORD,
        expect="uncounted-call",
    ),
    bug(
        "batched-flags-unpacked-swapped",
        "runtime/paged_attention.py",
        "        n, k, needs_gather, store_out = key.num_seqs, key.kv_blocks, key.needs_gather, key.store_out\n",
        "        n, k, needs_gather, store_out = key.num_seqs, key.kv_blocks, key.store_out, key.needs_gather\n",
        "the batched kernel's two flags are unpacked in swapped order: each graph is compiled with the other "
        "flag pair than its compile event's label says (tokens stay right)",
        WORD,
        expect="mislabelled-compile",
    ),
    bug(
        "default-pool-without-null-block",
        "runtime/config.py",
        "        return self.max_num_seqs * self.max_blocks_per_seq + 1\n",
        "        return self.max_num_seqs * self.max_blocks_per_seq\n",
        "the default pool forgets the null block, one block short of DESIGN's",
        WORD,
        check_args=("--max-model-len", "16"),  # a size flag: the runtime's default pool, not the embedded 8
        expect="config-mismatch",
    ),
    bug(
        "recompile-limit-from-kv-ladder",
        "runtime/limits.py",
        '        limit = max(dynamo["recompile_limit"], buckets + COMPILE_HEADROOM)\n',
        "        limit = (config.max_blocks_per_seq - 1).bit_length() + 1  # a graph per KV rung\n",
        "the recompile limit is sized from the KV ladder (3 rungs at the default config), not the bucket "
        "count: prefill alone has 4 warm graphs, past the limit Dynamo runs eagerly",
        WORD,
        expect="recompile-limit-too-low",
    ),
    bug(
        "add-drops-stop-tokens",
        "runtime/engine.py",
        "        rid = self.scheduler.add(prompt_token_ids, max_tokens, request_id, stop_token_ids, ignore_eos)\n",
        "        rid = self.scheduler.add(prompt_token_ids, max_tokens, request_id, (), ignore_eos)\n",
        "add_request drops the client's stop tokens: the request runs, and its request event says what it "
        "runs, so a check that judged the runtime's echo of the request would judge it by the wrong rules",
        WORD,
        expect="request-echo",
    ),
    bug(
        "finish-record-one-token-short",
        "runtime/engine.py",
        "            self.finished[r.request_id] = ev.Finished(r.request_id, tuple(r.output), r.finish_reason)\n",
        "            self.finished[r.request_id] = ev.Finished(r.request_id, tuple(r.output[:-1]), r.finish_reason)\n",
        "what users read of a finished request (its finished record) is one token short of the tokens the "
        "token events carried and the reference judged",
        WORD,
        expect="delivery-mismatch",
    ),
    bug(
        "ragged-decodes-batched-only-beside-a-chunk",
        "runtime/ragged_metadata.py",
        "        if self.bucketer.uses_batched(len(decodes)):\n",
        "        if self.bucketer.uses_batched(len(decodes)) and chunk is not None:\n",
        "the ragged builder batches decodes only in a mixed step: a decode-only step of 4 or more rows makes "
        "one per-sequence call a row, whose keys are warm, where the contract makes one batched call",
        META,
        # 5 sequences, so 4 can decode; small lengths keep the run to seconds.
        check_args=("--layout", "ragged", "--max-num-seqs", "5", "--max-model-len", "8", "--block-size", "2"),
        expect="batched-rule",
    ),
    bug(
        "abort-of-an-ended-request-is-a-no-op",
        "runtime/engine.py",
        '        self._ended("abort", None, [self.scheduler.abort(request_id)])\n',
        "        if request_id not in self.finished:  # already over: nothing to do\n"
        '            self._ended("abort", None, [self.scheduler.abort(request_id)])\n',
        "an abort of a request that already ended returns quietly instead of refusing: the client is told it "
        "aborted something that had finished (caught only when traffic happens to abort late; the edge "
        "scenarios do it on every config)",
        SCHED,  # pinned by tests/verify/test_edge_scenarios.py (monkeypatched: no copy of the tree): silent-abort
    ),
    bug(
        "ignore-eos-silences-stop-tokens",
        "runtime/requests.py",
        "        if t in r.stop_token_ids or (t == self.config.model.eos_token_id and not r.ignore_eos):\n",
        "        if not r.ignore_eos and (t in r.stop_token_ids or t == self.config.model.eos_token_id):\n",
        "ignore_eos also silences the request's own stop tokens, which still end it in vLLM",
        SCHED,  # pinned by tests/verify/test_edge_scenarios.py (monkeypatched: no copy of the tree): finish-reason
    ),
    bug(
        "one-token-prompt-refused",
        "runtime/requests.py",
        "        if not tokens:\n",
        "        if len(tokens) <= 1:\n",
        "the emptiness check is off by one: a one-token prompt, which most coverage witnesses join with, is refused",
        WORD,
        expect="coverage-miss",
    ),
]


# -- running ---------------------------------------------------------------------------------------------
@dataclass
class Outcome:
    name: str
    kind: str
    description: str
    check_exit: int | str = "-"  # int, or "timeout"
    hunt_exit: int | str = "-"
    check_seconds: float = 0.0
    hunt_seconds: float = 0.0
    check_first: str = ""
    hunt_first: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return CAUGHT in (self.check_exit, self.hunt_exit)

    @property
    def first(self) -> str:
        return self.check_first or self.hunt_first


def validate(bugs: list[Bug]) -> None:
    """Every old snippet occurs exactly once in its file, and names are unique."""
    names = [b.name for b in bugs]
    assert len(set(names)) == len(names), "duplicate bug names"
    for b in bugs:
        assert b.file.startswith("runtime/"), b.name
        text = (REPO / b.file).read_text()
        for old, new in b.edits:
            assert old != new, f"{b.name}: an edit changes nothing"
            n = text.count(old)
            assert n == 1, f"{b.name}: old snippet occurs {n} times in {b.file}:\n{old}"


def repo_files(tracked_only: bool) -> list[str]:
    args = ["git", "-C", str(REPO), "ls-files", "-z", "--cached"]
    if not tracked_only:
        args += ["--others", "--exclude-standard"]
    out = subprocess.run(args, check=True, capture_output=True).stdout.decode()
    return sorted({p for p in out.split("\0") if p and (REPO / p).is_file()})


def copy_tree(dest: Path, files: list[str]) -> None:
    for rel in files:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)


def apply(b: Bug, root: Path) -> None:
    path = root / b.file
    text = path.read_text()
    for old, new in b.edits:
        assert text.count(old) == 1, f"{b.name}: snippet not unique in the copy"
        text = text.replace(old, new)
    path.write_text(text)


def child_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPYRE_")}
    env["PYTHONPATH"] = str(root)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def probe(root: Path) -> None:
    """`runtime` and `spyre_verify` must come from the copy, not from the editable install."""
    code = "import runtime, spyre_verify; print(runtime.__file__); print(spyre_verify.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=child_env(root), capture_output=True, text=True, check=True
    ).stdout.split()
    for path in out:
        assert Path(path).resolve().is_relative_to(root.resolve()), f"imported {path}, not the copy under {root}"


def run_tool(args: list[str], root: Path, timeout: int) -> tuple[int | str, float, str]:
    """Exit code (or "timeout"), seconds, and the tail of stderr."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "spyre_verify", *args],
        cwd=root,
        env=child_env(root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=timeout)
        code: int | str = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        code = "timeout"
    return code, round(time.perf_counter() - t0, 1), err[-4000:]


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("[spyre-verify]")]
    return lines[-1].strip() if lines else ""


def check_first(out: Path, code: int | str, err: str) -> str:
    if code != CAUGHT:
        return last_line(err) if code not in (0, "-") else ""
    try:
        p = json.loads((out / "check.json").read_text())
    except (OSError, ValueError):
        return "(no check.json)"
    for c in p.get("checks", []):
        if c.get("violations"):
            v = c["violations"][0]
            return f"[{v['check']}/{v['kind']}] {v['message']}"
    return f"error: {p['error']}" if p.get("error") else "(exit 1, no violation listed)"


def hunt_first(out: Path, code: int | str, err: str) -> str:
    if code != CAUGHT:
        return last_line(err) if code not in (0, "-") else ""
    try:
        p = json.loads((out / "hunt.json").read_text())
    except (OSError, ValueError):
        return "(no hunt.json)"
    found = p.get("findings") or []
    if not found:
        return "(exit 1, no finding listed)"
    f = found[0]
    return f"[{f['property']}/{f['kind']}] {f['message']}"


def run_one(b: Bug | None, files: list[str], opts: argparse.Namespace) -> Outcome:
    name = b.name if b else "(baseline)"
    o = Outcome(name, b.kind if b else "-", b.description if b else "the unmodified tree")
    tmp = Path(tempfile.mkdtemp(prefix=f"rb-{name.strip('()')}-"))
    try:
        root = tmp / "repo"
        copy_tree(root, files)
        if b:
            apply(b, root)
        probe(root)
        check_out, hunt_out = tmp / "c", tmp / "h"
        o.check_exit, o.check_seconds, err = run_tool(
            ["check", "--no-controls", *(b.check_args if b else ()), "--out", str(check_out)], root, opts.timeout
        )
        o.check_first = check_first(check_out, o.check_exit, err)
        o.hunt_exit, o.hunt_seconds, err = run_tool(
            [
                "hunt",
                "--examples",
                str(opts.examples),
                "--seed",
                str(opts.seed),
                "--out",
                str(hunt_out),
                "--database",
                str(tmp / "db"),
            ],
            root,
            opts.timeout,
        )
        o.hunt_first = hunt_first(hunt_out, o.hunt_exit, err)
        for tool, code in (("check", o.check_exit), ("hunt", o.hunt_exit)):
            if code == 3:
                o.notes.append(f"{tool} crashed (exit 3): not a catch")
            elif code == 2:
                o.notes.append(f"{tool} exited 2 (bad input): not a catch")
            elif code == "timeout":
                o.notes.append(f"{tool} ran past {opts.timeout} s")
    finally:
        if opts.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return o


def table(outcomes: list[Outcome]) -> str:
    head = f"{'bug':<36} {'kind':<19} {'check':>5} {'hunt':>5}  caught  first violation / finding"
    lines = [head, "-" * len(head)]
    for o in outcomes:
        mark = "yes" if o.caught else ("BASE" if o.name == "(baseline)" else "NO")
        first = o.first.replace("\n", " ")[:150]
        lines.append(f"{o.name:<36} {o.kind:<19} {o.check_exit!s:>5} {o.hunt_exit!s:>5}  {mark:<6}  {first}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", metavar="NAME", help="run only these bugs (repeatable)")
    ap.add_argument("--jobs", type=int, default=1, help="bugs run at once (each runs its tools one after another)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--timeout", type=int, default=TIMEOUT_S, help="seconds per tool run")
    ap.add_argument("--examples", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", action="store_true", help="also run the unmodified tree first")
    ap.add_argument("--tracked-only", action="store_true", help="copy only tracked files (default: + untracked)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs")
    ap.add_argument("--list", action="store_true", help="list the bugs and exit")
    opts = ap.parse_args(argv)
    validate(BUGS)
    if opts.list:
        for b in BUGS:
            print(f"{b.name:<36} {b.file:<24} {b.kind:<19} {b.description}")
        return 0
    chosen: list[Bug | None] = [b for b in BUGS if not opts.only or b.name in opts.only]
    unknown = set(opts.only or ()) - {b.name for b in BUGS}
    if unknown:
        ap.error(f"unknown bug(s): {', '.join(sorted(unknown))}")
    if opts.baseline:
        chosen.insert(0, None)
    files = repo_files(opts.tracked_only)
    start = time.perf_counter()
    outcomes: list[Outcome] = []

    def one(b: Bug | None) -> Outcome:
        o = run_one(b, files, opts)
        print(f"[realistic-bugs] {o.name}: check {o.check_exit}, hunt {o.hunt_exit}", file=sys.stderr, flush=True)
        return o

    with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        outcomes = list(pool.map(one, chosen))
    bugs = [o for o in outcomes if o.name != "(baseline)"]
    caught = sum(o.caught for o in bugs)
    by_check = sum(o.check_exit == CAUGHT for o in bugs)
    print(table(outcomes))
    rate = 100.0 * caught / len(bugs) if bugs else 0.0
    print(
        f"\ncaught {caught} of {len(bugs)} ({rate:.0f}%); check alone {by_check}; {time.perf_counter() - start:.0f} s"
    )
    for o in outcomes:
        for note in o.notes:
            print(f"note: {o.name}: {note}")
    if opts.json:
        rows = [asdict(o) | {"caught": o.caught} for o in outcomes]
        summary = {"caught": caught, "total": len(bugs), "rate_percent": round(rate, 1), "check_alone": by_check}
        meta = {"examples": opts.examples, "seed": opts.seed, "timeout_s": opts.timeout, "repo": str(REPO)}
        opts.json.write_text(json.dumps({**meta, **summary, "results": rows}, indent=2) + "\n")
    baseline = next((o for o in outcomes if o.name == "(baseline)"), None)
    if baseline and baseline.caught:
        print("warning: the unmodified tree fails a tool; catches are not meaningful", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
