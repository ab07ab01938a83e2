"""The engine as the gateways see it: one declared API that the engine client
(frontend/engine_client.py, one scheduler) and the data-parallel replicas
(frontend/replicas.py, several schedulers seen as one) both implement.

The SDK gateway, the HTTP API, the service and the metrics are written against `Engine`, so
neither kind is tested for (`hasattr`) by its callers: a member one kind has no use for
answers plainly (`replica_health()` is None for one scheduler; `rank_health()` is empty for
replicas, which list their ranks under each replica). A request's events go to a `Sink`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from folio.frontend.structured_output_admission import GrammarAdmission
from folio.frontend.input_processor import InputProcessor, ModelFacts
from folio.frontend.prep import Preparer
from folio.frontend.stop_strings import StopStrings
from folio.shared.pooling.task import PoolingTask
from folio.shared.sampling_params import SamplingParams


@dataclass
class SampleResult:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str
    stop_reason: str | None
    logprobs: list[dict[str, Any]] | None     # per token: token_id, logprob, rank, text, top
    pooled: bytes | None = None               # a pooling request's vector (float32 bytes)


@dataclass
class FinalResult:
    samples: list[SampleResult]
    prompt_tokens: int
    prompt_logprobs: list[dict[str, Any]] | None   # from the second prompt token on


class Sink(Protocol):
    """Where one submitted request's events go: `delta` for every step (streams), then one
    `final` once every sample ended, or one `error`."""

    def delta(self, index: int, text: str, token_ids: list[int],
              logprobs: list[dict[str, Any]] | None) -> None: ...

    def final(self, result: FinalResult) -> None: ...

    def error(self, code: str, message: str) -> None: ...


@runtime_checkable
class Engine(Protocol):
    tokenizer: Any
    inputs: InputProcessor       # prompts and parameters, checked (one for every gateway)
    prep: Preparer               # heavy per-request work, off the event loop
    grammars: GrammarAdmission   # structured outputs' admission
    frontend_id: str
    observers: list[Any]         # metrics: called with (event, request, **details)
    draining: bool               # shutting down: the gateways refuse new requests

    # ---- state --------------------------------------------------------------------------

    @property
    def requests(self) -> Mapping[str, Any]:
        """The requests in flight, by engine id."""

    @property
    def scheduler_alive(self) -> bool: ...

    @property
    def engine_alive(self) -> bool:
        """Requests can be served now (a scheduler with its executor)."""

    @property
    def facts(self) -> ModelFacts:
        """What the input processor checks a request against."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def limits(self) -> tuple[int, int]:
        """(max_logprobs, max_n) as the scheduler enforces them."""

    @property
    def max_model_len(self) -> int | None: ...

    @property
    def loras(self) -> tuple[str, ...]:
        """The LoRA adapters requests may name now (docs/lora.md)."""

    @property
    def pooling(self) -> PoolingTask | None:
        """The pooling runner's task (shared/pooling/task.py); None: the generate runner."""

    def check_text_size(self, chars: int) -> None:
        """InputError for text that cannot fit the context, before it is tokenized."""

    def dead_reason(self) -> str:
        """Why requests cannot be served (when engine_alive is False)."""

    def replica_health(self) -> list[dict[str, Any]] | None:
        """Each data-parallel replica's health; None: one scheduler, no replicas."""

    def rank_health(self) -> list[dict[str, Any]]:
        """A tensor-parallel executor's ranks; empty for one process (and for replicas,
        which list them under each replica)."""

    # ---- lifetime -----------------------------------------------------------------------

    def tasks(self) -> list:
        """The coroutines that keep the link(s) to the scheduler(s) going."""

    def close(self) -> None: ...

    # ---- requests -----------------------------------------------------------------------

    def submit(self, prompt_ids: list[int], params: SamplingParams, sink: Sink,
               deadline_s: float | None = None, stops: StopStrings | None = None,
               client: str | None = None) -> str:
        """Queue a checked request; its events go to `sink`. Returns its engine id.
        `client`: who sent it, for the turns clients take (None: anonymous)."""

    def abort(self, request_id: str) -> None: ...

    def abort_all(self, reason: str) -> None:
        """Shutdown: abort every open request and fail it now."""

    async def stop_strings(self, params: SamplingParams) -> StopStrings | None:
        """params.stop's matching tables, built off the loop when they are long."""

    async def stats(self, timeout: float = 1.0) -> dict[str, Any]: ...

    async def kv_map(self, timeout: float = 1.0) -> dict[str, Any] | None: ...

    async def update_lora(self, name: str, path: str | None, timeout: float = 60.0
                          ) -> str | None:
        """Load the PEFT adapter at `path` as `name` (None: unload `name`) on the engine
        (every replica); returns why not (nothing changed), or None when done."""
