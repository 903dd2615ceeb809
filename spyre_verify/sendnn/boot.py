"""Everything before the plugin's engine exists: the process environment, the installed
version, whether its internals can be hooked, the tiny local model, and vLLM's config."""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import importlib.metadata
import json
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTED = "2.6.3"  # the plugin release this adapter was written and tested against
PACKAGE = "sendnn-inference"
INSTALL = "pip install -e '.[sendnn]' && pip uninstall -y torchvision torchaudio torchcodec"
BLOCK_SIZE = 64  # the plugin fixes it for decoder models
VOCAB, EOS = 512, 2

# What the adapter reaches into, as (module, dotted attribute): each must exist, or the plugin is
# refused at start-up naming the first that is missing (a release that moved it).
HOOKS = (
    ("vllm.v1.engine.core", "EngineCore.step"),
    ("vllm.v1.engine.core", "EngineCore.abort_requests"),
    ("vllm.v1.engine.core", "EngineCore.preprocess_add_request"),
    ("vllm.v1.engine.input_processor", "InputProcessor.process_inputs"),
    ("vllm.forward_context", "get_forward_context"),
    ("sendnn_inference.model_executor.model_loader.spyre", "SpyreCausalLM.forward"),
    ("sendnn_inference.model_executor.model_loader.spyre", "_Fp32LogitsWrapper"),
    ("sendnn_inference.v1.worker.spyre_model_runner", "ChunkedPrefillModelRunner.pre_warmup"),
    ("sendnn_inference.v1.worker.spyre_model_runner", "ChunkedPrefillModelRunner._prepare_decode"),
    ("sendnn_inference.v1.worker.spyre_model_runner", "ChunkedPrefillModelRunner._prepare_chunked_prefill"),
    ("sendnn_inference.v1.worker.spyre_model_runner", "ChunkedPrefillModelRunner._mark_input_tensors"),
    ("sendnn_inference.v1.core.scheduler", "ChunkedPrefillSpyreScheduler.update_from_output"),
    ("sendnn_inference.v1.core.scheduler", "ChunkedPrefillSpyreScheduler.finish_requests"),
)

# The process environment the in-process engine needs; set before vLLM is first imported.
ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this process, where the hooks are
    "SENDNN_INFERENCE_DYNAMO_BACKEND": "eager",  # fp32 weights; the adapter installs the compiled slot
    "SENDNN_INFERENCE_UPDATE_THREAD_CONFIG": "0",  # it would rewrite OMP_NUM_THREADS for the whole process
    "SENDNN_INFERENCE_OVERRIDE_SIGNALS_HANDLER": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "WARNING",
    "VLLM_LOGGING_STREAM": "ext://sys.stderr",  # a command's stdout is its own (check --json)
    "VLLM_CONFIGURE_LOGGING": "1",
    "MASTER_ADDR": "127.0.0.1",
}


class PluginUnavailable(ValueError):
    """A release whose internals the adapter cannot hook, or sizes or options it cannot run."""


class PluginNotInstalled(ImportError):
    """The plugin is not installed: an optional runtime, absent (`runtimes` lists it so, not as broken)."""

    not_installed = True  # the protocol's mark of an optional runtime whose package is absent


def installed_version() -> str:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise PluginNotInstalled(f"{PACKAGE} is not installed; install the extra: {INSTALL}") from None


@functools.cache  # one line per process, however many runtimes it builds
def warn_untested(version: str) -> None:
    if version != TESTED:
        print(
            f"spyre-verify: warning: {PACKAGE} {version} is not the release this adapter was tested with ({TESTED})",
            file=sys.stderr,
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prepare_process() -> str:
    """Set the environment, import the plugin and check every hook point; the installed version."""
    version = installed_version()
    for key, value in ENV.items():
        os.environ[key] = value
    os.environ["MASTER_PORT"] = str(free_port())  # each engine starts torch.distributed afresh
    present = set()
    for module in dict.fromkeys(m for m, _ in HOOKS):
        try:
            with contextlib.redirect_stdout(sys.stderr):  # the plugin prints notes on import
                importlib.import_module(module)
            present.add(module)
        except ModuleNotFoundError as e:
            if e.name != module:  # a module it imports is missing: a broken install, not a moved release
                raise PluginUnavailable(f"{PACKAGE} {version}: import {module} failed: {e}") from None
        except Exception as e:  # a broken install (the CUDA torchvision left in place, say), not a moved release
            raise PluginUnavailable(f"{PACKAGE} {version}: import {module} failed: {type(e).__name__}: {e}") from None
    missing = [f"{m}.{a}" for m, a in HOOKS if m not in present or not _has(m, a)]
    if missing:
        raise PluginUnavailable(
            f"{PACKAGE} {version}: cannot hook {missing[0]}"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; "
            f"this adapter was tested with {TESTED}"
        )
    warn_untested(version)
    return version


def _has(module: str, dotted: str) -> bool:
    obj: Any = importlib.import_module(module)  # imported already (prepare_process)
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


@functools.cache  # the same files serve every engine of the process
def model_dir() -> Path:
    """A 2-layer llama config (no weights: vLLM loads it with random ones) and a word-level
    tokenizer, written once per process: no model hub is reached."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    top = tempfile.mkdtemp(prefix="spyre-verify-sendnn-")
    atexit.register(shutil.rmtree, top, ignore_errors=True)
    root = Path(top) / "tiny-llama"
    root.mkdir(parents=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": EOS,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }
    (root / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
    words = ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, VOCAB)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.save_pretrained(str(root))
    return root


@dataclass(frozen=True)
class Sizes:
    """What the adapter asks of vLLM, from the harness's Settings."""

    max_model_len: int
    max_num_seqs: int
    chunk: int  # max_num_batched_tokens: the plugin's prefill chunk, a multiple of 64
    tkv_limit: int  # VLLM_DT_MAX_BATCH_TKV_LIMIT
    # Off: the adapter does not yet translate vLLM's shared blocks into `holders` and cache events.
    prefix_caching: bool
    seed: int = 0


def sizes_of(settings: Any) -> Sizes:
    """The plugin's sizes for `settings`; a size it cannot take is refused naming the flag."""
    bs, L, S = settings.block_size, settings.max_model_len, settings.max_num_seqs
    if bs != BLOCK_SIZE:
        raise PluginUnavailable(f"--block-size={bs}: the plugin fixes the block size at {BLOCK_SIZE}; pass 64")
    if L % BLOCK_SIZE or L < 2 * BLOCK_SIZE:
        raise PluginUnavailable(f"--max-model-len={L}: the plugin needs a multiple of 64, at least 128")
    options = dict(getattr(settings, "options", {}) or {})
    refused = {
        "num_blocks": "--num-blocks: the plugin sizes its own pool (max_num_seqs * max_model_len / 64 + 1, rounded "
        "up to a multiple of max_num_seqs); leave it out",
        "layout": "--layout ragged: the plugin's batching is its own (reports call its layout none); leave it out",
        "batched_decode": "SPYRE_BATCHED_DECODE=0: the plugin has no per-sequence decode kernel; unset it",
    }
    for key, why in refused.items():
        if key in options:
            raise PluginUnavailable(why)
    # The plugin's CLI default chunk of 512, capped at half of max_model_len so that prompts are split.
    chunk = min(512, max(BLOCK_SIZE, L // 2 // BLOCK_SIZE * BLOCK_SIZE))
    native = getattr(settings, "native", None)
    limit = getattr(native, "max_batch_tkv_limit", None) or L * S
    return Sizes(L, S, chunk, int(limit), prefix_caching=False)


def vllm_config(sizes: Sizes) -> Any:
    """vLLM's config for the tiny model, as its Python API builds one; the three settings the
    plugin's own CLI defaults would set are passed explicitly."""
    from vllm.engine.arg_utils import EngineArgs

    os.environ["VLLM_DT_MAX_BATCH_TKV_LIMIT"] = str(sizes.tkv_limit)  # the platform caches it in the env
    path = str(model_dir())
    args = EngineArgs(
        model=path,
        tokenizer=path,
        load_format="dummy",
        dtype="float32",
        max_model_len=sizes.max_model_len,
        max_num_seqs=sizes.max_num_seqs,
        max_num_batched_tokens=sizes.chunk,
        enable_chunked_prefill=True,
        enable_prefix_caching=sizes.prefix_caching,
        enforce_eager=True,
        seed=sizes.seed,
    )
    # The platform prints its start-up logo on stdout here: to stderr instead, so that a command's
    # stdout (check --json, runtimes --json) stays what the command printed.
    with contextlib.redirect_stdout(sys.stderr):
        return args.create_engine_config()
