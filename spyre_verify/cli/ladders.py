"""`spyre-verify ladders`: the ladders, the warm set and every pruned bucket with its reason, and
whether the warm set is exactly the reachable set the harness derives (walk or closed form)."""

from __future__ import annotations

import argparse
import json
import time

from runtime.bucketer import SpyreAttnBucketer
from runtime.config import RuntimeConfig
from spyre_verify.cli.config import add_config_flags, config_from_args
from spyre_verify.oracle.results import Reachable
from spyre_verify.oracle.walk import reachable
from spyre_verify.runtimes import BUNDLED_FACTORY, open_runtime, resolve_name, settings_for


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ladders", help="print ladders and enumerated buckets for a config")
    add_config_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def ladders_payload(b: SpyreAttnBucketer) -> dict[str, object]:
    c = b.config
    return {
        "schema_version": 1,
        "block_size": c.block_size,
        "max_model_len": c.max_model_len,
        "max_num_seqs": c.max_num_seqs,
        "env_overrides": c.env_overrides(),
        "layout": c.layout,
        **{name: list(ladder) for name, ladder in b.ladders().items()},
        "num_blocks": c.total_blocks,
        "usable_blocks": c.usable_blocks,
        **(
            {
                "max_num_batched_tokens": c.token_budget,
                "batched_decode_entries": c.decode_entries,
                "prefix_caching": c.prefix_caching,
            }
            if c.ragged
            else {"max_batch_tkv_limit": c.batch_tkv_limit}
        ),
        "buckets": {k: [list(x.key.values()) for x in b.buckets(k)] for k in b.kernels},
        "counts": {k: len(b.buckets(k)) for k in b.kernels},
        # `rule` is a short code for the reason: disabled, flags, gather, pool, volume or unreachable.
        "pruned": [
            {"kernel": p.bucket.kernel, "key": list(p.bucket.key.values()), "rule": p.rule, "reason": p.reason}
            for p in b.pruned()
        ],
    }


def exactness(b: SpyreAttnBucketer) -> dict[str, object]:
    """The bucketer's warm set against the harness's own reachable set (never the bucketer's)."""
    t0 = time.perf_counter()
    reach = reachable(b.config)
    warm = b.warm_set()
    out: dict[str, object] = {
        "method": reach.method,
        "exact": warm == reach.buckets,
        "reachable": len(reach.buckets),
        "warm": len(warm),
        "missing": [str(x) for x in sorted(reach.buckets - warm)],
        "extra": [str(x) for x in sorted(warm - reach.buckets)],
    }
    if b.config.ragged and b.config.prefix_caching:
        out["cache_hit_keys"] = cache_hit_keys(b.config, reach)
    out["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def cache_hit_keys(config: RuntimeConfig, reach: Reachable) -> list[dict[str, str]]:
    """The keys only a prefix-cache hit reaches (the oracle's set with caching on, less its set with
    caching off), each with the oracle's witness: the shared join that starts the chunk mid-prompt."""
    without = reachable(config.with_(enable_prefix_caching=False)).buckets
    return [
        {"bucket": str(x), "witness": ", ".join(map(str, reach.witnesses[x]))} for x in sorted(reach.buckets - without)
    ]


def exactness_line(e: dict[str, object]) -> str:
    if e["exact"]:
        return f"warm set == reachable set: {e['warm']} buckets ({e['method']}, {e['seconds']} s)"
    return f"warm set != reachable set ({e['method']}): missing {e['missing'] or 'none'}, extra {e['extra'] or 'none'}"


def foreign(target: str, config: object, as_json: bool) -> int:
    """Another runtime's ladders and warm plan, as its protocol reports them (it prunes by its own rules)."""
    rt = open_runtime(target, settings_for(config))
    try:
        plan = list(rt.warm_plan())
        kernels = sorted({b.kernel for b in plan})
        payload = {
            "schema_version": 1,
            "runtime": rt.name,
            "ladders": {k: list(v) for k, v in rt.ladders().items()},
            "warm_plan": {k: [str(b) for b in plan if b.kernel == k] for k in kernels},
        }
    finally:
        rt.close()
    if as_json:
        print(json.dumps(payload))
        return 0
    print(f"runtime: {payload['runtime']} ({target})")
    for name, ladder in payload["ladders"].items():
        print(f"{name:>15}: {ladder}")
    for k, buckets in payload["warm_plan"].items():
        print(f"{k:>15}: {len(buckets)} buckets  {' '.join(b.replace(' ', '') for b in buckets)}")
    return 0


def run(args: argparse.Namespace) -> int:
    target = resolve_name(args.runtime)
    if target != BUNDLED_FACTORY:
        return foreign(target, config_from_args(args), args.json)
    b = SpyreAttnBucketer(config_from_args(args))
    payload = ladders_payload(b)
    payload["exactness"] = exact = exactness(b)
    verdict = 0 if exact["exact"] else 1  # a warm set that stalls or wastes is a finding
    if args.json:
        print(json.dumps(payload))
        return verdict
    c = b.config
    layout = (
        f"layout=ragged max_num_batched_tokens={c.token_budget} batched_decode_entries={c.decode_entries}"
        if c.ragged
        else f"max_batch_tkv_limit={c.batch_tkv_limit}"
    )
    print(
        f"config: block_size={c.block_size} max_model_len={c.max_model_len} max_num_seqs={c.max_num_seqs} "
        f"pool={c.total_blocks} blocks ({c.usable_blocks} usable) {layout}"
    )
    if c.max_model_len % c.block_size and not c.ragged:  # legal, and said: the ladders count whole blocks
        top = c.max_blocks_per_seq * c.block_size
        print(
            f"   note: max_model_len={c.max_model_len} is not a multiple of block_size={c.block_size}: a sequence "
            f"holds at most {c.max_model_len} tokens, but padded shapes round up to whole blocks ({top} tokens)"
        )
    for name, ladder in b.ladders().items():
        print(f"{name:>15}: {list(ladder)}")
    for k in b.kernels:
        keys = " ".join(str(x.key).replace(" ", "") for x in b.buckets(k))
        print(f"{k:>15}: {len(b.buckets(k))} buckets  {keys}")
    pruned = b.pruned()
    print(f"{'pruned':>15}: {len(pruned)}")
    for p in pruned:
        print(f"  {p.bucket}: [{p.rule}] {p.reason}")
    hits = exact.get("cache_hit_keys")
    if isinstance(hits, list):  # ragged with prefix caching
        print(
            f"{'cache hits':>15}: {len(hits)} key(s) only a prefix-cache hit reaches" + (", witnesses:" if hits else "")
        )
        for k in hits:
            print(f"  {k['bucket']}: {k['witness']}")
    print(f"{'exactness':>15}: {exactness_line(exact)}")
    return verdict
