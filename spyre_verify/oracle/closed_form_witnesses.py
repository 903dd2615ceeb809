"""The padded closed form's witnesses: one builder per way into a raw dispatch shape, and the
replay on `ContractModel` that decides whether a witness fits a config.

Each builder returns the cheapest path of its shape (`closed_form` argues why, rule by rule):
requests whose prompts and `max_tokens` are as small as the target allows, so that each one
holds the fewest pool blocks, projects the least volume and needs the least `max_model_len`.
A builder only lays out positions; it never asks whether the pool, the slots, `max_model_len`
or the volumetric limit allow it. `replay` does, by running the path on the harness's own
tensor-free model, so the resource arithmetic lives in one place (the model):

- a refusal (an add `reject_reason` names, or a join's step that does not admit it) means the
  config has no room for this path: `replay` returns None;
- anything else that goes off script (a decode step that is not a decode, an abort of a request
  that is not running, a last shape in another bucket) is a bug in a builder, never a fact about
  the config: an AssertionError naming the config and the path.

Paths use `Action` as `walk.reachable` returns them: a join is a request added just before
the step that prefills it, a decode one step, an abort (between steps) names the index-th join.
"""

from __future__ import annotations

from runtime.config import RuntimeConfig
from spyre_verify.oracle.model import ContractModel
from spyre_verify.oracle.results import Action, Shape

Path = tuple[Action, ...]
DECODE = Action("decode")


def join(prompt_len: int, max_tokens: int) -> Action:
    return Action("join", prompt_len, max_tokens)


def prefill_alone(bs: int, j: int) -> Path:
    """A prompt of j whole blocks into an empty batch: tkv = j * bs, one block each, no decode."""
    return (join(j * bs, 1),)


def prefill_after_decode(bs: int, j: int) -> Path:
    """The top prefill below its block's end, with no shift: A alone at tkv (j - 1) * bs decodes
    once (tkv (j - 1) * bs + 1, inside block j) and a one-token prompt joins it and ends at once."""
    return join((j - 1) * bs, 3), DECODE, join(1, 1)


def prefill_by_shift(bs: int, j: int) -> Path:
    """The top prefill at tkv (j - 1) * bs + 1 reached by a shift: A alone at tkv bs decodes once
    (tkv bs + 1), then a prompt of j - 1 blocks shifts the batch by j - 2 blocks."""
    return join(bs, 3), DECODE, join((j - 1) * bs, 1)


def below_one_block(bs: int) -> Path:
    """A row alone at tkv 1 (bs >= 2): A (one block) decodes once to tkv bs + 1, B (one token,
    so bs of left padding) joins, A is aborted, and the strip drops B's padding block."""
    return join(bs, 3), DECODE, join(1, 2), Action("abort", index=0)


def prefill_by_strip_and_shift(bs: int, j: int) -> Path:
    """The top prefill at tkv (j - 1) * bs + 1 from the row alone at tkv 1: a prompt of j - 1
    blocks shifts it by j - 1 blocks, and the row holds one block instead of two."""
    return *below_one_block(bs), join((j - 1) * bs, 1)


def staircase(bs: int, s: int, m: int, r: int) -> Path:
    """s rows decoding at tkv (m - 1) * bs + r (r < bs), every row with one token left: R1 alone
    at tkv (m - 1) * bs decodes r times, then s - 1 one-token prompts join it (no shift)."""
    return (join((m - 1) * bs, r + 2), *(DECODE,) * r, *(join(1, 2),) * (s - 1), DECODE)


def decode_below_one_block(bs: int, s: int) -> Path:
    """s rows decoding at tkv 1 (one block, bs >= 2): the row alone at tkv 1, then s - 1
    one-token prompts join it with no left padding."""
    return (*below_one_block(bs), *(join(1, 2),) * (s - 1), DECODE)


def replay(config: RuntimeConfig, path: Path) -> Shape | None:
    """The shape the path's last action dispatches on `ContractModel(config)`, or None when the
    config refuses one of its requests (at `add_request` or at admission)."""
    model = ContractModel(config)
    ids: list[str] = []
    shape: Shape | None = None
    for i, action in enumerate(path):
        if action.kind == "abort":
            _require(action.index < len(ids) and model.abort_refusal(ids[action.index]) is None, config, path, i)
            model.abort(ids[action.index])
            continue
        if action.kind == "join":
            if model.reject_reason(action.prompt_len, action.max_tokens) is not None:
                return None
            ids.append(f"w{len(ids)}")
            model.add(ids[-1], action.prompt_len, action.max_tokens)
            step = model.step()
            if step.kind != "prefill" or step.admitted != ids[-1]:
                return None  # it waits: no room (slots, pool, max_model_len or volume)
        else:
            step = model.step()
            _require(step.kind == "decode", config, path, i)
        shape = step.shape
    return shape


def _require(ok: bool, config: RuntimeConfig, path: Path, i: int) -> None:
    if not ok:
        raise AssertionError(
            f"closed-form witness {' '.join(map(str, path))} goes off script at action {i} ({path[i]}) "
            f"for block_size={config.block_size} max_model_len={config.max_model_len} "
            f"max_num_seqs={config.max_num_seqs}: a bug in the witness builder"
        )
