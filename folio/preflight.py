"""The checks of settings against the machine, before any process starts (or any weight is
read): the model directory (config.json, architecture, safetensors headers) or GGUF file
(its header read bounded by the file's size, its metadata checked against its tensors'
names, types and shapes, every tensor inside the data section), the
scheduler's constraints that need the checkpoint's context limit, memory, and the TCP ports
to bind. folio/checks.py runs them for each command, folio.LLM for itself. Each problem is a
SettingError naming the setting."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from folio.executor.quantization.gguf.file import is_directory_or_gguf, is_gguf
from folio.executor.model_config import ModelConfig
from folio.executor.quantization.groups import prequantized_problem, quantization_problem
from folio.executor.models.hf_config import read_model_config
from folio.placement import executor_runs_on_cpu
from folio.shared.config import EngineConfig, ExecutorCapacity, SchedulerConfig, SettingError
from folio.shared.safetensors_header import SafetensorsError, read_shapes



def check_model_dir(model: str) -> ModelConfig:
    path = Path(model)
    if is_gguf(path):
        return _check_gguf(model)
    if not path.is_dir():
        raise SettingError("model", f"{model}: no such directory")
    try:
        config = read_model_config(path)
    except FileNotFoundError as error:
        raise SettingError("model", f"{model}: {error}") from None
    except json.JSONDecodeError as error:
        raise SettingError("model", f"{model}: config.json is not valid JSON ({error})") \
            from None
    except KeyError as error:
        raise SettingError("model", f"{model}: config.json lacks {error}") from None
    except (ValueError, TypeError) as error:
        raise SettingError("model", f"{model}: {error}") from None
    for file in _weight_files(path):
        _check_safetensors(model, file)
    return config


def _check_gguf(model: str) -> ModelConfig:
    if not Path(model).is_file():
        raise SettingError("model", f"{model}: no such GGUF file")
    try:
        return read_model_config(model)
    except (ValueError, KeyError, TypeError, OSError) as error:
        raise SettingError("model", f"{model}: {error}") from None


def check_engine(config: EngineConfig) -> ModelConfig:
    """Everything about `config` that can be known without loading weights."""
    model_config = check_model_dir(config.model)
    if model_config.hybrid is not None:   # what recurrent state cannot run with yet
        from folio.executor.models.hybrid.executor_checks import unsupported

        problem = unsupported(config, model_config)
        if problem is not None:
            raise SettingError(*problem)
    if model_config.gemma4 is not None:   # what its unlike layers cannot run with yet
        from folio.executor.models.gemma4.executor_checks import unsupported as gemma4_problem

        problem = gemma4_problem(config, model_config)
        if problem is not None:
            raise SettingError(*problem)
    if config.tensor_parallel_size > 1:   # heads and MLP must split evenly across the ranks
        from folio.executor.parallel.rules import check_shardable

        try:
            check_shardable(model_config, config.tensor_parallel_size)
        except ValueError as error:
            raise SettingError("tensor_parallel_size", str(error).split(" ", 1)[1]) from None
    if not config.skip_tokenizer_init and not is_directory_or_gguf(config.tokenizer_path):
        raise SettingError("tokenizer", f"{config.tokenizer_path}: no such directory or "
                           "GGUF file")
    if config.quantization != "none" and not executor_runs_on_cpu(config.device):
        raise SettingError("quantization", f"{config.quantization} weights run on the CPU "
                           f"executor only (the device is {config.device}: give --device cpu)")
    problem = quantization_problem(config.quantization, model_config,
                                   config.tensor_parallel_size)
    if problem is not None:
        raise SettingError("quantization", problem)
    _check_prequantized(config, model_config)
    _check_kv_cache_dtype(config)
    _check_lora(config, model_config)
    _check_pooling(config)
    _check_cpu_memory(config)
    limit = model_config.context_limit
    if config.max_model_len is not None and config.max_model_len > limit:
        raise SettingError("max_model_len", f"({config.max_model_len}) is larger than the "
                           f"model supports ({limit})")
    # The same checks the scheduler makes at the executor's hello; the pool's size is not
    # known yet (one block stands in for it).
    SchedulerConfig.from_engine(config, ExecutorCapacity(
        num_kv_blocks=config.num_kv_blocks or 1, block_size=config.block_size,
        max_model_len=config.max_model_len or limit, vocab_size=model_config.vocab_size,
        eos_token_ids=model_config.eos_token_ids))
    return model_config


def _check_prequantized(config: EngineConfig, model_config: ModelConfig) -> None:
    """A pre-quantized checkpoint (executor/quantization/prequantized_config.py) whose layout maps onto Folio's
    quantized weights; --quantization then only quantizes the layers it holds in float."""
    scheme = model_config.prequantized
    if scheme is None:
        return
    if not executor_runs_on_cpu(config.device):
        raise SettingError("device", f"a pre-quantized checkpoint ({scheme.describe()}) runs "
                           f"on the CPU executor only (the device is {config.device}: give "
                           "--device cpu)")
    problem = prequantized_problem(model_config, config.tensor_parallel_size)
    if problem is not None:
        raise SettingError("model", f"{config.model}: {problem}")
    if scheme.act_order:
        _check_trivial_g_idx(config.model, scheme.group)


def _check_trivial_g_idx(model: str, group: int | None) -> None:
    """Act-order (GPTQ desc_act, compressed-tensors actorder): each g_idx must still be
    k // group (desc_act changed nothing); any other order is refused."""
    import numpy as np
    from safetensors import safe_open

    for file in _weight_files(Path(model)):
        with safe_open(str(file), framework="numpy") as handle:
            for name in handle.keys():
                if not name.endswith((".g_idx", ".weight_g_idx")):
                    continue
                g_idx = handle.get_tensor(name).astype(np.int64)
                trivial = np.arange(g_idx.size) // (group or g_idx.size)
                if not np.array_equal(g_idx, trivial):
                    raise SettingError("model", f"{model}: act-order (desc_act, actorder) "
                                       f"with a non-trivial g_idx ({name}) is not supported")


def _check_lora(config: EngineConfig, model_config: ModelConfig) -> None:
    """LoRA's settings, and every start-time adapter read against the model (its files'
    headers, not its weights; executor/lora/files.py)."""
    if not config.enable_lora:
        if config.lora_modules:
            raise SettingError("lora_modules", "needs --enable-lora")
        return
    if config.max_cpu_loras is not None and config.max_cpu_loras < config.max_loras:
        raise SettingError("max_cpu_loras", f"({config.max_cpu_loras}) must be >= max_loras "
                           f"({config.max_loras})")
    from folio.executor.lora.files import LoraError, lora_name_problem, plan_adapter
    from folio.executor.models.architectures import ARCHITECTURES

    names = ARCHITECTURES[model_config.architecture].weights
    for name, path in config.lora_paths.items():
        problem = lora_name_problem(name)
        if problem is not None:
            raise SettingError("lora_modules", problem)
        try:
            plan_adapter(name, path, model_config, names, config.max_lora_rank)
        except LoraError as error:
            raise SettingError("lora_modules", str(error)) from None


def _check_pooling(config: EngineConfig) -> None:
    """The runner and its pooling, as the executor will resolve them (shared/pooling/)."""
    from folio.shared.pooling.task import resolve_pooling_task

    try:
        task = resolve_pooling_task(config.model, config.runner, config.pooling_type,
                                    config.score_tokens)
    except ValueError as error:
        raise SettingError("runner", f"cannot serve this model: {error}") from None
    if task is None:
        for name in ("pooling_type", "score_tokens"):
            if getattr(config, name) not in ("auto", None):
                raise SettingError(name, "is the pooling runner's; this engine runs the "
                                   "generate runner (--runner pooling)")


def _check_kv_cache_dtype(config: EngineConfig) -> None:
    """A stored type the attention backend cannot read is refused here, not in the executor."""
    name = config.kv_cache_dtype
    if name == "auto":
        return
    triton = config.attention_backend == "triton" or (
        config.attention_backend == "auto" and not executor_runs_on_cpu(config.device))
    if triton and name == "bfloat16":
        raise SettingError("kv_cache_dtype", f"{name}: the Triton attention kernels (the GPU "
                           "executor's) read float caches in the model's dtype only (give "
                           "--dtype bfloat16 and --kv-cache-dtype auto), or int8 and fp8_* "
                           "caches")
    if name.startswith("fp8_"):
        import torch   # only for a float8 cache: is it in this build?

        wanted = {"fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}[name]
        if getattr(torch, wanted, None) is None:
            raise SettingError("kv_cache_dtype", f"{name}: torch {torch.__version__} has no "
                               f"{wanted}; give int8 or bfloat16")


def _check_cpu_memory(config: EngineConfig) -> None:
    if config.num_kv_blocks is not None or not executor_runs_on_cpu(config.device):
        return
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if config.cpu_kv_cache_gib * 2**30 >= total:
        raise SettingError("cpu_kv_cache_gib", f"({config.cpu_kv_cache_gib} GiB) does not fit "
                           f"in this machine's {total / 2**30:.1f} GiB of memory")


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise SettingError("model", f"{model_dir}: unreadable {index.name} ({error})") \
                from None
        return [model_dir / name for name in names]
    if (model_dir / "model.safetensors").is_file():
        return [model_dir / "model.safetensors"]
    raise SettingError("model", f"{model_dir}: no model.safetensors or "
                       "model.safetensors.index.json")


def _check_safetensors(model: str, file: Path) -> None:
    """The header parses and every tensor's bytes lie inside the file."""
    try:
        read_shapes(file)
    except SafetensorsError as error:
        raise SettingError("model", f"{model}: {file.name} is not a readable safetensors "
                           f"file ({error})") from None


def check_ports_free(host: str, port: int | None, zmq_address: str | None) -> None:
    """The TCP ports `folio serve` will bind are free now: one taken is refused in one line
    before any process starts, not a server's traceback after the other roles started."""
    if port:
        _check_free("port", host, port)
    if zmq_address and zmq_address.startswith("tcp://"):
        zmq_host, _, zmq_port = zmq_address.removeprefix("tcp://").rpartition(":")
        if zmq_port.isdigit() and int(zmq_port):
            _check_free("zmq_address", zmq_host.strip("[]"), int(zmq_port))


def _check_free(setting: str, host: str, port: int) -> None:
    try:
        infos = socket.getaddrinfo(None if host in ("*", "") else host, port,
                                   type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise SettingError(setting, f"cannot resolve {host!r}: {error.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn and libzmq
        try:
            probe.bind(address)
        except OSError as error:
            raise SettingError(setting, f"cannot bind {host}:{port}: {error.strerror} "
                               "(another server holds it? choose another port)") from None
