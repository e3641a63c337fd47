"""The options the commands share (models, caches, RPC workers, sampling): each
is added to a parser here, and read back and checked here before any model loads;
and what the commands open from them: the engine, the conversation store."""

from __future__ import annotations

import argparse
import math
from types import MappingProxyType

from edgespec.cli.bars import ProgressBars
from edgespec.chat.template import BUILTIN_FORMATS, known_template
from edgespec.cli.output import note
from edgespec.engine.events import MODES, GenerationParams
from edgespec.errors import TemplateError
from edgespec.limits import LIMITS, ascii_number
from edgespec.load_settings import FLASH_ATTN, LOAD_LIMITS, SWITCHES, LoadSettings
from edgespec.modes import DEFAULT_MODE, MODE_K, reply_decoding


# -- models ------------------------------------------------------------------------------

MODEL_NAMES = "a .gguf path, a registry name or hf:OWNER/REPO/FILE.gguf"
"""How a model may be named wherever the CLI takes one."""

LOAD_FLAGS = MappingProxyType({
    "n_ctx": ("--ctx", "N"), "n_threads": ("--threads", "N"),
    "n_gpu_layers": ("--n-gpu-layers", "N"), "n_gpu_layers_draft": ("--n-gpu-layers-draft", "N"),
})
"""The command line's name for each of LoadSettings' numeric fields (load_settings.LOAD_LIMITS)."""


def add_model_options(p: argparse.ArgumentParser) -> None:
    """--target/--draft/--pair and how to run them: the fields of LoadSettings
    (edgespec/load_settings.py: each one's range, default and help), RPC workers
    and caches."""
    g = p.add_argument_group("models")
    add_model_names(g)
    add_no_draft(g)
    add_load_options(g)
    add_rpc_options(g)
    add_cache_options(g)


def add_load_options(g) -> None:
    """--ctx, --threads, --n-gpu-layers, --n-gpu-layers-draft, --exact, --flash-attn, from
    LoadSettings (load_settings_from_args reads them back, checked)."""
    for name, limit in LOAD_LIMITS.items():
        flag, metavar = LOAD_FLAGS[name]
        g.add_argument(flag, dest=name, type=_within(limit), default=limit.default, metavar=metavar,
                       help=f"{limit.help} ({limit.range()})".replace("%", "%%"))  # argparse formats help with %
    g.add_argument("--exact", action="store_true", help=SWITCHES["exact"])
    g.add_argument("--flash-attn", choices=FLASH_ATTN, default=LoadSettings().flash_attn_name,
                   help=SWITCHES["flash_attn"])


def _within(limit):
    """An argparse type: a whole number in `limit`'s range (else a usage error naming it)."""
    def whole(text: str) -> int:
        try:
            value = int(_ascii(text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not limit.allows(value):
            raise argparse.ArgumentTypeError(f"must be {limit.range()} ({limit.help}), got {value}")
        return value
    return whole


def add_model_names(g) -> None:
    """--pair, --target, --draft: which models to load (the app takes them too)."""
    g.add_argument("--pair", metavar="NAME", help="a target + draft pair from the registry (default: the bundled pair)")
    g.add_argument("--target", metavar="PATH_OR_NAME", help=f"target model: {MODEL_NAMES}")
    g.add_argument("--draft", metavar="PATH_OR_NAME", help=f"draft model: {MODEL_NAMES}")


def add_no_draft(g) -> None:
    """--no-draft (the app takes it too)."""
    g.add_argument("--no-draft", action="store_true", help="load no draft model (plain or lookup only)")


def load_settings_from_args(args: argparse.Namespace) -> LoadSettings:
    """The LoadSettings the options give (their ranges were checked as they were parsed),
    before loading: threads above the cores are lowered, with a note; GPU layers on
    a build without a GPU backend are noted (everything runs on the CPU)."""
    import os

    from edgespec.llama import system_info

    cores = os.cpu_count() or 1
    if args.n_threads is not None and args.n_threads > cores:
        note(f"--threads {args.n_threads}: this machine has {cores} cores; using {cores}")
        args.n_threads = cores
    if args.exact and args.flash_attn == "off":
        raise ValueError("--exact needs flash attention (its Q8_0 KV cache): leave out --flash-attn off")
    values = {name: getattr(args, name) for name in LOAD_LIMITS}
    settings = LoadSettings(**values, exact=args.exact, flash_attn=FLASH_ATTN[args.flash_attn],
                            rpc=rpc_split(args), cache=cache_from_args(args))
    asked = [option for option, value in (("--n-gpu-layers", settings.n_gpu_layers and not settings.rpc),
                                          ("--n-gpu-layers-draft", settings.n_gpu_layers_draft)) if value]
    if asked and not system_info()["gpu_offload"]:
        note(f"this llama.cpp build has no GPU backend, so {' and '.join(asked)} "
             f"{'is' if len(asked) == 1 else 'are'} ignored and the models run on "
             "the CPU. To use the GPU, rebuild llama-cpp-python for it (README, \"Installing for your "
             "hardware\"): CMAKE_ARGS=\"-DGGML_METAL=on\" (Apple Silicon) or CMAKE_ARGS=\"-DGGML_CUDA=on\" "
             "(NVIDIA) pip install --force-reinstall --no-cache-dir llama-cpp-python")
    return settings


def chosen_pair(args: argparse.Namespace) -> str | None:
    """The registry pair the options run: --pair, else the default pair; None where
    --target names the models."""
    from edgespec.models.registry import DEFAULT_PAIR

    return None if args.target else args.pair or DEFAULT_PAIR


def engine_from_args(args: argparse.Namespace, *, progress=None, settings: LoadSettings | None = None):
    """Load the models the options name (edgespec.load.load_engine), downloading what is
    missing; `settings`: load_settings_from_args(args), where the caller checked them already."""
    from edgespec.load import load_engine
    from edgespec.models.fetch import resolve_model

    settings = settings or load_settings_from_args(args)
    try:
        return load_engine(args.target, args.draft, pair=chosen_pair(args), no_draft=args.no_draft,
                           resolve=lambda name: resolve_model(name, progress=progress), settings=settings)
    finally:
        if isinstance(progress, ProgressBars):
            progress.close()  # a failed download leaves its bar drawn, and the terminal usable


def open_store():
    """The conversation store; what opening it needed telling (a damaged file moved aside) goes to stderr."""
    from edgespec.chat import ConversationStore

    store = ConversationStore()
    if store.notice:
        note(store.notice)
    return store


# -- caches ------------------------------------------------------------------------------

def add_cache_options(g) -> None:
    """--parallel, --cache-ram, --cache-disk: conversations held in the KV caches and their snapshots;
    --lookup-pool: the earlier text the pool drafter proposes from."""
    from edgespec.engine.slots import SLOTS
    from edgespec.engine.runtime import CacheSettings

    default = CacheSettings()
    g.add_argument("--parallel", type=positive, default=None, metavar="N",
                   help=f"conversations held in the KV caches at once (default {SLOTS} on a GPU with flash "
                        "attention, else 1: there attention goes over every conversation's cells, slowing each "
                        "token); those let go wait in RAM, and coming back to one reads only its new tokens")
    g.add_argument("--cache-ram", type=_non_negative, default=default.ram_mib, metavar="MiB",
                   help=f"host memory for the caches of conversations let go (default {default.ram_mib}; 0: none)")
    g.add_argument("--cache-disk", type=_non_negative, default=default.disk_mib, metavar="MiB",
                   help=f"disk space for them between runs, in edgespec's cache folder (default {default.disk_mib}; "
                        "0: none)")
    g.add_argument("--lookup-pool", type=_non_negative, default=default.pool_mib, metavar="MiB",
                   help="earlier replies, prompts and files kept (as tokens, in edgespec's cache folder) for "
                        f"drafting text that repeats them (default {default.pool_mib}; 0: off)")


def cache_from_args(args: argparse.Namespace):
    from edgespec.load import kv_cache

    return kv_cache(parallel=args.parallel, ram_mib=args.cache_ram, disk_mib=args.cache_disk,
                    pool_mib=args.lookup_pool)


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _whole(text, least=1)


def _non_negative(text: str) -> int:
    return _whole(text, least=0)


def _whole(text: str, *, least: int) -> int:
    try:
        value = int(_ascii(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least {least}, got {text!r}")
    return value


def _ascii(text: str) -> str:
    """`text`, refused as a usage error where it holds more than ASCII (limits.ascii_number)."""
    try:
        return ascii_number(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _ascii_number(kind: type):
    """An argparse type: `kind` (int or float) read from ASCII text only (_ascii); argparse
    names it in its message for text that is no number ("invalid int value")."""
    def number(text: str):
        return kind(_ascii(text))
    number.__name__ = kind.__name__
    return number


def port(text: str) -> int:
    """A TCP port: 1-65535."""
    value = _non_negative(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {text!r}")
    return value


def port_or_any(text: str) -> int:
    """A TCP port to listen on, or 0: any free one (the OS picks, and the address printed says which)."""
    return 0 if text.strip() == "0" else port(text)


# -- RPC workers -------------------------------------------------------------------------

def add_rpc_options(g) -> None:
    """--rpc and --tensor-split: the target's layers on llama.cpp RPC workers (`edgespec worker`)."""
    g.add_argument("--rpc", type=_rpc_workers, default=None, metavar="HOST:PORT[,HOST:PORT...]",
                   help="put the target's offloaded layers on these llama.cpp RPC workers (`edgespec worker` or "
                        "rpc-server) and this machine's GPUs; the draft model stays here")
    g.add_argument("--tensor-split", type=_weights, default=None, metavar="W[,W...]",
                   help="with --rpc: how to weight the devices (the workers' in --rpc order, then local GPUs); "
                        "default: by free memory, as llama.cpp does")
    g.add_argument("--local-output", action="store_true",
                   help="with --rpc: keep the output layer on this machine, so that a pass brings back a hidden "
                        "state per token instead of n_vocab logits (less traffic, more work here)")


def _rpc_workers(text: str):
    from edgespec.net import parse_endpoints

    try:
        return parse_endpoints(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _weights(text: str) -> tuple[float, ...]:
    try:
        weights = tuple(float(w) for w in _ascii(text).split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers separated by commas, e.g. 3,1 (got {text!r})") from None
    if any(not 0 <= w < math.inf for w in weights) or not sum(weights) > 0:  # NaN fails every comparison
        raise argparse.ArgumentTypeError(f"the weights must be finite numbers, 0 or more, and not all 0 (got {text!r})")
    return weights


def rpc_split(args: argparse.Namespace):
    """--rpc/--tensor-split as a Split for the target (None without --rpc)."""
    from edgespec.net import Split

    if (args.tensor_split or args.local_output) and not args.rpc:
        option = "--tensor-split" if args.tensor_split else "--local-output"
        raise ValueError(f"{option} is about the devices of --rpc: pass --rpc HOST:PORT too")
    return Split(args.rpc, args.tensor_split or (), local_output=args.local_output) if args.rpc else None


# -- text for the model -----------------------------------------------------------------

def model_text(name: str):
    """An argparse type for text that goes to the model (the prompt, --system, --once,
    --stop): bytes of the command line that are not UTF-8 become U+FFFD, with a note
    naming `name`, as stdin's do (decoded())."""
    def convert(value: str) -> str:
        return decoded(value.encode("utf-8", "surrogateescape"), name)
    return convert


def decoded(data: bytes, where: str) -> str:
    """`data` as UTF-8 text; bytes that are not UTF-8 become U+FFFD, with a note
    naming `where` ("stdin", "--system") and the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        note(f"{where} is not valid UTF-8 (first bad byte at byte {e.start}); invalid bytes were replaced by U+FFFD")
        return data.decode("utf-8", errors="replace")


# -- templates and sampling --------------------------------------------------------------

def add_template_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--template", metavar="FORMAT", type=_template,
                   help=f"chat format for a model whose GGUF has no template ({', '.join(BUILTIN_FORMATS)}), "
                        "or Jinja source")


def _template(text: str) -> str:
    """--template checked while parsing, not after the models load."""
    try:
        return known_template(text)
    except TemplateError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_sampling_options(p: argparse.ArgumentParser, *, max_tokens: int | None = LIMITS["max_tokens"].default) -> None:
    """--mode, the generation parameters and --stop; `max_tokens`: this command's reply limit
    (serve: limits.SERVER_MAX_TOKENS, none)."""
    g = p.add_argument_group("decoding")
    g.add_argument("--mode", choices=MODES, default=None,
                   help="plain: no speculation; draft: the draft model; lookup: prompt lookup; "
                        f"auto: whichever pays on this machine (default: the pair's, in models.yaml; "
                        f"without a pair {DEFAULT_MODE})")
    add_limited(g, "k", int, metavar="N", default=None,
                none="the pair's for its mode, in models.yaml; else the mode's: "
                     + ", ".join(f"{mode} {k}" for mode, k in MODE_K.items() if mode != "plain"))
    add_limited(g, "temperature", float)
    add_limited(g, "top_k", int)
    add_limited(g, "top_p", float)
    add_limited(g, "seed", int)
    add_limited(g, "max_tokens", int, default=max_tokens, none="until the context is full")
    g.add_argument("--stop", action="append", default=[], type=model_text("--stop"), metavar="TEXT",
                   help="stop at this text (repeatable)")


def add_limited(g, name: str, kind: type, *, default=..., none: str = "", **kw) -> None:
    """--NAME for a generation parameter, with its range and default from edgespec/limits.py
    (checked by params_from_args, as the engine checks it); `default` where a command's
    differs, `none` what a default of None means."""
    limit = LIMITS[name]
    default = limit.default if default is ... else default
    said = f"; default {default:g}" if default is not None else f"; default: {none}" if none else ""
    g.add_argument("--" + name.replace("_", "-"), type=_ascii_number(kind), default=default,
                   help=f"{limit.help} ({limit.range()}{said})", **kw)


def params_from_args(args: argparse.Namespace) -> GenerationParams:
    """The generation parameters, checked as the engine checks them (so that a bad
    value is refused before the models load). --mode and --k left out are the pair's
    (edgespec.load.pair_decoding), its k only with its mode (modes.reply_decoding)."""
    from edgespec.engine.sampling import check_params

    mode, k = args.mode, args.k
    if mode is None or k is None:
        from edgespec.load import pair_decoding

        mode, k = reply_decoding(mode, k, pair_decoding(chosen_pair(args)))
    params = GenerationParams(
        mode=mode, k=k, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, seed=args.seed, max_tokens=args.max_tokens, stop=tuple(args.stop),
    )
    check_params(params)
    return params
