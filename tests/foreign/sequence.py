"""One request as the scheduler tracks it, and the checks a request must pass to be accepted."""

from __future__ import annotations

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from enum import Enum, auto

from .config import Config


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


@dataclass(eq=False)  # identity: the scheduler removes a sequence from its queues by it
class Sequence:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    status: Status = Status.WAITING
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    num_cached: int = 0  # positions whose KV is in the cache
    reserved: int = 0  # blocks promised at admission and not yet allocated
    reason: str | None = None

    @property
    def last_token(self) -> int:
        return self.output[-1] if self.output else self.prompt[-1]

    def lifetime_blocks(self, block_size: int) -> int:
        """Blocks it can ever need: the prompt and every generated token but the last are cached."""
        return math.ceil((len(self.prompt) + self.max_tokens - 1) / block_size)

    def stop_reason(self, token: int, eos: int) -> str | None:
        """Why the request ends after producing `token`, if it does; a stop beats a length."""
        if token in self.stop_token_ids or (token == eos and not self.ignore_eos):
            return "stop"
        return "length" if len(self.output) >= self.max_tokens else None


def token_ids(name: str, value: object, vocab_size: int, allow_empty: bool) -> tuple[int, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Seq):
        raise ValueError(f"{name}={value!r}: must be a list of token ids")
    out = tuple(value)
    if not out and not allow_empty:
        raise ValueError(f"{name}=[]: must hold at least one token")
    for t in out:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
            raise ValueError(f"{name}: token {t!r} is not an id in [0, {vocab_size})")
    return out


def parse_request(
    config: Config,
    prompt: object,
    max_tokens: object,
    request_id: str,
    stop_token_ids: object,
    ignore_eos: object,
) -> Sequence:
    """A new waiting Sequence, or a ValueError naming the field when it could never be served."""
    vocab = config.model.vocab_size
    tokens = token_ids("prompt_token_ids", prompt, vocab, allow_empty=False)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens!r}: must be an integer >= 1")
    if len(tokens) + max_tokens > config.max_model_len:
        raise ValueError(
            f"prompt of {len(tokens)} tokens + max_tokens={max_tokens} exceeds max_model_len={config.max_model_len}"
        )
    stops = token_ids("stop_token_ids", stop_token_ids, vocab, allow_empty=True)
    if not isinstance(ignore_eos, bool):
        raise ValueError(f"ignore_eos={ignore_eos!r}: must be True or False")
    return Sequence(request_id, tokens, max_tokens, stops, ignore_eos)
