"""The settings of the processes around the engine, each declared once (shared/settings.py):
how their ZeroMQ links are secured, how long a SIGTERM drain may take, what one SDK client
may hold, and the frontend's HTTP API. The commands' flags and FOLIO_* variables are
generated from these fields (folio/flags.py); the engine's own settings are in
shared/config.py."""

from __future__ import annotations

from dataclasses import MISSING, dataclass

from folio.shared.config import (CURVE_KEYS_HELP, MAX_REQUESTS_PER_CLIENT,
                                 MAX_REQUESTS_PER_CLIENT_HELP, SHUTDOWN_HELP,
                                 SHUTDOWN_TIMEOUT_S)
from folio.shared.settings import (Checked, at_least, in_range, optional, positive_int,
                                   setting)
from folio.shared.transport import INSECURE_HELP

TOOL_CALL_PARSERS = ("hermes", "llama3_json")   # frontend/openai/tool_parsers.py reads these formats
REASONING_PARSERS = ("qwen3", "deepseek_r1", "gpt_oss")   # frontend/reasoning/parsers.py
RESPONSES_STORE_SIZE = 1024   # responses kept for previous_response_id (frontend/openai/responses)


@dataclass(frozen=True, kw_only=True)
class TransportSettings(Checked):
    curve_keys: str | None = setting(None, CURVE_KEYS_HELP, metavar="DIR")
    insecure_transport: bool = setting(False, INSECURE_HELP)


@dataclass(frozen=True, kw_only=True)
class ShutdownSettings(Checked):
    shutdown_timeout_s: float = setting(SHUTDOWN_TIMEOUT_S, SHUTDOWN_HELP, "shutdown-timeout",
                                        check=at_least(0, " seconds"))


@dataclass(frozen=True, kw_only=True)
class ClientLimitSettings(Checked):
    max_requests_per_client: int = setting(MAX_REQUESTS_PER_CLIENT,
                                           MAX_REQUESTS_PER_CLIENT_HELP, metavar="N",
                                           check=positive_int)


@dataclass(frozen=True, kw_only=True)
class HttpSettings(Checked):
    """The frontend's OpenAI-compatible HTTP API (FrontendConfig's fields of the same
    names); api_key_file is read into api_key before the frontend starts."""

    host: str = setting("127.0.0.1", "HTTP API interface")
    port: int | None = setting(None, "HTTP API port (OpenAI-compatible); 0 or none: no HTTP",
                               check=optional(in_range(0, 65535)))
    served_model_name: list[str] | None = setting(
        None, "the model name(s) clients use; answers report the first (default: "
        "folio-default for the built-in model, else the checkpoint directory's name and the "
        "path as given, as vLLM serves it)",
        metavar="NAME", nargs="+")
    api_key: str | None = setting(
        None, "require 'Authorization: Bearer KEY' on /v1 routes and /metrics (a flag shows "
        "in `ps`: prefer FOLIO_API_KEY or --api-key-file)")
    api_key_file: str | None = setting(None, "read the API key from FILE (its first line)",
                                       metavar="FILE")
    metrics_public: bool = setting(False, "serve /metrics without the API key")
    tool_call_parser: str | None = setting(
        None, "read tool calls out of answers in this format, for chat requests with tools "
        "and tool_choice auto (default: auto refused)", choices=TOOL_CALL_PARSERS)
    reasoning_parser: str | None = setting(
        None, "separate the reasoning from the answer in this format (vLLM's names): "
        "reasoning_content in chat, reasoning items in /v1/responses, thinking blocks in "
        "/v1/messages (default: none, the answer is the text as written)",
        choices=REASONING_PARSERS)
    enable_lora_runtime_updates: bool = setting(
        False, "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (behind the API "
        "key; the engine needs --enable-lora); off, they answer 404")
    responses_store_size: int = setting(
        RESPONSES_STORE_SIZE, "how many finished /v1/responses answers this server keeps in "
        "memory for GET /v1/responses/{id} and previous_response_id, the least recently used "
        "evicted first; 0 keeps none", metavar="N", check=at_least(0))
    priority_floor: int = setting(
        0, "the most urgent priority (the lowest value) an HTTP request may ask under "
        "--scheduling-policy priority; a lower one is refused (400) unless the request "
        "comes with --priority-api-key", metavar="N")
    priority_api_key: str | None = setting(
        None, "a second API key for trusted callers: it opens the API as --api-key does, "
        "and its requests may ask any priority (prefer FOLIO_PRIORITY_API_KEY: a flag shows "
        "in `ps`)")
    allowed_hosts: str | None = setting(
        None, "Host header names HTTP answers, comma-separated, or '*' for any (default: on "
        "a loopback --host only localhost, 127.0.0.1 and ::1)", metavar="NAMES")


@dataclass(frozen=True, kw_only=True)
class FrontendLinks(Checked):
    model: str | None = setting(None, "directory with the tokenizer files (default: the "
                                "built-in model)")
    client_address: str = setting(MISSING, "where SDK clients connect (this process binds "
                                  "it)")
    scheduler_address: str = setting(MISSING, "the scheduler's frontend address (several, "
                                     "comma-separated: data-parallel replicas)")
    client_curve: bool = setting(True, "with --curve-keys: SDK clients need keys too "
                                 "(--no-client-curve leaves the client port plain)")
