"""A LoRA adapter directory in PEFT's format (adapter_config.json + adapter_model.safetensors)
checked against a model without reading its weights or importing torch, so `folio serve`
refuses a bad --lora-modules entry before any process starts (docs/lora.md).

The result says, for each adapter module, which Folio module (and which slice of a fused
one) it changes, its rank and its scale (alpha / r, or alpha / sqrt(r) with rsLoRA).

The files are user input, read where a stall would stop every request (the executor, the
HTTP frontend): regular files only, size-bounded, and nothing in them is run as a regular
expression (alpha_pattern keys are matched as module-name suffixes, in linear time).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from folio.executor.model_config import ModelConfig
from folio.executor.models.weight_names import WeightNames
from folio.shared.safetensors_header import SafetensorsError, open_regular, read_shapes

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_CONFIG_BYTES = 2**20         # adapter_config.json: PEFT writes a few KiB
MAX_HEADER_BYTES = 16 * 2**20    # adapter_model.safetensors' JSON header (tensor names)
MAX_ALPHA = 1e6                  # |lora_alpha|: far past any trained adapter's
# Folio modules an adapter may change: each layer's attention and dense MLP projections.
TARGETS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
_PREFIX = "base_model.model."
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])(\.default)?\.weight$")
# What a pattern key's name may hold (parse_pattern_key): no other regex syntax, as keys are
# matched as names, never compiled.
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
# Unicode categories refused in adapter names: control, format (zero-width, bidi
# controls), surrogates, private use, unassigned, and every separator (whitespace).
_BAD_NAME_CATEGORIES = ("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp")


class LoraError(ValueError):
    """An adapter Folio cannot serve; the message names the cause."""


@dataclass(frozen=True)
class ModulePart:
    module: str        # Folio module path, e.g. "layers.3.self_attn.qkv_proj"
    part: int | None   # the slice of a fused module (q, k, v / gate, up), None if unfused
    key_a: str         # tensor names in adapter_model.safetensors
    key_b: str
    rank: int
    scale: float


def target_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of every module an adapter may change, by Folio module path."""
    q_size = config.num_heads * config.head_dim
    qkv = q_size + 2 * config.num_kv_heads * config.head_dim
    sizes = {"self_attn.qkv_proj": (config.hidden_size, qkv),
             "self_attn.o_proj": (q_size, config.hidden_size),
             "mlp.gate_up_proj": (config.hidden_size, 2 * config.intermediate_size),
             "mlp.down_proj": (config.intermediate_size, config.hidden_size)}
    shapes = {}
    for layer in range(config.num_layers):
        sparse = config.moe is not None and config.moe.sparse_layers[layer]
        for target in TARGETS:
            if not (sparse and target.startswith("mlp.")):
                shapes[f"layers.{layer}.{target}"] = sizes[target]
    return shapes


def fused_sizes(module: str, out_size: int, config: ModelConfig) -> list[int]:
    """Row counts of a fused module's slices: q, k, v or gate, up."""
    if module.endswith("qkv_proj"):
        kv = config.num_kv_heads * config.head_dim
        return [config.num_heads * config.head_dim, kv, kv]
    return [out_size // 2, out_size // 2]


def lora_name_problem(name: str) -> str | None:
    """Why `name` cannot name an adapter, or None: names are matched byte for byte, so
    invisible or look-alike characters would make a second name that reads as the first."""
    for char in name:
        if char.isspace() or unicodedata.category(char) in _BAD_NAME_CATEGORIES:
            return (f"adapter name {name!r} holds U+{ord(char):04X}: control, zero-width, "
                    "bidi-control and whitespace characters are not allowed in adapter names")
    return None


@dataclass(frozen=True)
class AdapterFiles:
    """An adapter directory's files, checked on their own (no model needed)."""
    settings: dict                              # adapter_config.json, its fields checked
    shapes: dict[str, tuple[int, ...]]          # tensor name -> shape
    modules: dict[str, dict[str, str]]          # adapter module -> {"A": key, "B": key}


def check_adapter_files(name: str, path: str | Path) -> AdapterFiles:
    """The checks that need no model: the HTTP frontend runs them off its event loop
    before asking the engine, and plan_adapter runs them again (the same bounds)."""
    directory = Path(path)
    settings = _read_config(directory)
    shapes = _read_header(directory)
    modules: dict[str, dict[str, str]] = {}
    for key in shapes:
        match = _KEY.match(key.removeprefix(_PREFIX))
        if match is None:
            raise LoraError(f"adapter {name!r}: tensor {key!r} is not a LoRA A or B weight "
                            "(embeddings, DoRA magnitudes and saved modules are not supported)")
        modules.setdefault(match["module"], {})[match["ab"]] = key
    if not modules:
        raise LoraError(f"adapter {name!r}: {WEIGHTS_FILE} holds no LoRA weights")
    for module, keys in modules.items():
        if set(keys) != {"A", "B"}:
            raise LoraError(f"adapter {name!r}: module {module!r} has lora_{''.join(keys)} "
                            "but not its pair")
        a, b = shapes[keys["A"]], shapes[keys["B"]]
        if len(a) != 2 or len(b) != 2 or b[1] != a[0] or a[0] < 1:
            raise LoraError(f"adapter {name!r}: {module!r} has lora_A {list(a)} and lora_B "
                            f"{list(b)}, not [r, in] and [out, r] with r >= 1")
    return AdapterFiles(settings, shapes, modules)


def plan_adapter(name: str, path: str | Path, config: ModelConfig, names: WeightNames,
                 max_rank: int) -> list[ModulePart]:
    """Every check of an adapter against the model; a problem is a LoraError naming it."""
    files = check_adapter_files(name, path)
    settings, shapes_in_file = files.settings, files.shapes
    use_rslora = settings.get("use_rslora", False)
    alpha = settings.get("lora_alpha", 8)
    alpha_pattern = pattern_index(settings.get("alpha_pattern") or {})
    shapes = target_shapes(config)
    parts = []
    for module, keys in sorted(files.modules.items()):
        target = names.target(module + ".weight")
        folio_module = None if target is None or target[1] is not None \
            else target[0].removesuffix(".weight")
        if folio_module is None or folio_module not in shapes:
            raise LoraError(f"adapter {name!r}: target module {module!r} is not one the "
                            "model has for LoRA (the attention and dense MLP projections of "
                            f"{config.architecture})")
        a, b = shapes_in_file[keys["A"]], shapes_in_file[keys["B"]]
        rank = a[0]
        if rank > max_rank:
            raise LoraError(f"adapter {name!r}: {module!r} has rank {rank}, over "
                            f"--max-lora-rank {max_rank}")
        part = target[2]
        in_size, out_size = shapes[folio_module]
        want_out = out_size if part is None else fused_sizes(folio_module, out_size,
                                                             config)[part]
        if a[1] != in_size or b[0] != want_out:
            raise LoraError(f"adapter {name!r}: {module!r} maps {a[1]} -> {b[0]} features; "
                            f"the model's maps {in_size} -> {want_out} (an adapter for "
                            "another base model?)")
        module_alpha = float(pattern_value(alpha_pattern, module, alpha))
        scale = module_alpha / (math.sqrt(rank) if use_rslora else rank)
        parts.append(ModulePart(folio_module, part, keys["A"], keys["B"], rank, scale))
    return parts


def pattern_index(patterns: dict) -> dict[tuple[str, str], tuple[int, object]]:
    """alpha_pattern / rank_pattern keys (checked by _check_settings) by (anchor, name):
    the first key's file position and value."""
    index: dict[tuple[str, str], tuple[int, object]] = {}
    for position, (key, value) in enumerate(patterns.items()):
        parsed = parse_pattern_key(key)
        if parsed is not None:
            index.setdefault(parsed, (position, value))
    return index


def pattern_value(index: dict[tuple[str, str], tuple[int, object]], module: str, default):
    """PEFT's pattern lookup (`(.*\\.)?(KEY)$`, the first key in file order that matches)
    without running a regex: a plain key matches the module's name or a suffix of it on a
    dot boundary ("q_proj" matches "model.layers.0.self_attn.q_proj"), a "^" key only the
    whole name, a ".*\\." key only a proper suffix. Linear in the name's length."""
    parts = module.split(".")
    hits = []
    for i in range(len(parts)):
        suffix = ".".join(parts[i:])
        for anchor in ("", "^" if i == 0 else "."):
            if (anchor, suffix) in index:
                hits.append(index[(anchor, suffix)])
    return min(hits, key=lambda hit: hit[0])[1] if hits else default


def parse_pattern_key(key: str) -> tuple[str, str] | None:
    """(anchor, dotted name) of a key in the regex forms PEFT's docs and PEFT itself write:
    NAME, ^NAME, .*\\.NAME (PEFT's fused MoE keys), each NAME with dots and dashes plain
    or escaped (re.escape), and an optional trailing $. None: any other regex syntax."""
    anchor, rest = "", key.removesuffix("$")
    if rest.startswith("^"):
        anchor, rest = "^", rest[1:]
    if rest.startswith(".*\\."):
        anchor, rest = ".", rest[4:]
    name, escaped = [], False
    for char in rest:
        if escaped:
            if char not in ".-":
                return None
            name.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in _NAME_CHARS:
            name.append(char)
        else:
            return None
    text = "".join(name)
    if escaped or not text or ".." in text or text.startswith(".") or text.endswith("."):
        return None
    return anchor, text


def _read_config(directory: Path) -> dict:
    file = directory / CONFIG_FILE
    try:
        with open_regular(file) as handle:
            text = handle.read(MAX_CONFIG_BYTES + 1)
        if len(text) > MAX_CONFIG_BYTES:
            raise LoraError(f"{str(file)!r} is over {MAX_CONFIG_BYTES} bytes (PEFT writes "
                            "a few KiB)")
        settings = json.loads(text)
    except FileNotFoundError:
        raise LoraError(f"no LoRA adapter at {str(directory)!r}: {CONFIG_FILE} is missing") \
            from None
    except LoraError:   # over the size bound, said above
        raise
    except RecursionError:   # the JSON scanner's own depth guard
        raise LoraError(f"cannot read {str(file)!r}: JSON nested too deeply") from None
    except (OSError, ValueError) as error:
        raise LoraError(f"cannot read {str(file)!r}: {error}") from None
    if not isinstance(settings, dict):
        raise LoraError(f"{str(file)!r} is not a JSON object")
    _check_settings(file, settings)
    return settings


def _check_settings(file: Path, settings: dict) -> None:
    """The fields Folio reads or refuses, checked for type and range."""
    where = repr(str(file))
    kind = settings.get("peft_type", "LORA")
    if kind != "LORA":
        raise LoraError(f"{where}: peft_type {kind!r} is not LORA")
    if settings.get("use_dora"):
        raise LoraError(f"{where}: DoRA adapters (use_dora) are not supported")
    if settings.get("bias", "none") != "none":
        raise LoraError(f"{where}: bias {settings['bias']!r} is not supported (none)")
    if settings.get("modules_to_save"):
        raise LoraError(f"{where}: modules_to_save is not supported")
    if not isinstance(settings.get("use_rslora", False), bool):
        raise LoraError(f"{where}: use_rslora must be true or false")
    rank = settings.get("r", 1)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LoraError(f"{where}: r must be an integer >= 1, got {_short(rank)}")
    _check_alpha(where, "lora_alpha", settings.get("lora_alpha", 8))
    for field in ("alpha_pattern", "rank_pattern"):
        patterns = settings.get(field) or {}
        if not isinstance(patterns, dict):
            raise LoraError(f"{where}: {field} must be an object of module name -> value, "
                            f"got {type(patterns).__name__}")
        for key, value in patterns.items():
            _check_pattern_key(where, field, key)
            if field == "alpha_pattern":
                _check_alpha(where, f"alpha_pattern[{_short(key)}]", value)
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LoraError(f"{where}: rank_pattern[{_short(key)}] must be an integer >= 1, "
                                f"got {_short(value)}")


def _check_alpha(where: str, field: str, value) -> None:
    """A finite number of at most MAX_ALPHA in magnitude (10^400 in JSON is an int that
    no float holds, or inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LoraError(f"{where}: {field} must be a number, got {_short(value)}")
    try:
        finite = math.isfinite(float(value)) and abs(float(value)) <= MAX_ALPHA
    except OverflowError:
        finite = False
    if not finite:
        raise LoraError(f"{where}: {field} must be a finite number of magnitude at most "
                        f"{MAX_ALPHA:g}, got {_short(value)}")


def _check_pattern_key(where: str, field: str, key: str) -> None:
    if parse_pattern_key(key) is None:
        raise LoraError(f"{where}: {field} key {_short(key)} is not a module name: Folio "
                        "matches keys as dotted module names or their suffixes (NAME, ^NAME, "
                        ".*\\.NAME), not as regular expressions")


def _short(value, limit: int = 80) -> str:
    """repr(value) cut to `limit` characters, for messages about untrusted input."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**limit \
        else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= limit else text[:limit] + "..."


def _read_header(directory: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, from the safetensors header; the bytes must lie in the file."""
    file = directory / WEIGHTS_FILE
    if not file.exists():
        raise LoraError(f"no LoRA weights at {str(directory)!r}: {WEIGHTS_FILE} is missing "
                        "(adapter_model.bin is not read)")
    try:
        return read_shapes(file, max_header=MAX_HEADER_BYTES)
    except SafetensorsError as error:
        raise LoraError(f"{str(file)!r} is not a readable safetensors file: {error}") from None
