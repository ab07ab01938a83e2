"""A request as the scheduler sees it: token ids, token counts and state. Its blocks are
not here: KVCacheManager holds every block table (scheduler/kv/kv_manager.py), keyed by the
request's handle."""

from __future__ import annotations

import enum
import time

from folio.shared.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"      # preempted with its KV copied to the CPU swap pool
    FORKING = "forking"      # a child of n > 1 waiting for its first sibling's prompt
    FINISHED = "finished"


class Request:
    __slots__ = ("request_id", "handle", "prompt_token_ids", "output_token_ids", "sampling",
                 "status", "num_computed_tokens", "finish_reason", "on_executor",
                 "num_pending", "admit_seq", "resumed_step", "num_preemptions",
                 "fork_children", "prompt_logprobs_next", "arrival_time", "queue_s",
                 "stop_length_at", "stop_ids", "prompt_len", "num_tokens", "stop_num_tokens",
                 "draft_steps", "num_draft_slots", "spec_proposed", "spec_accepted",
                 "spec_paused_until", "spec_steps", "spec_accepted_total", "prefix_seed",
                 "client", "queue_key", "lora_passes")

    def __init__(self, request_id: str, handle: int, prompt_token_ids: list[int],
                 sampling: SamplingParams) -> None:
        self.request_id = request_id
        self.handle = handle   # unique per Scheduler: the executor's and the KV manager's key
        self.prompt_token_ids = prompt_token_ids   # never changes
        self.output_token_ids: list[int] = []
        # Cached counts the per-step loops read instead of len() and products, each kept
        # equal to what it caches by its one writer (tests/scheduler/test_scheduler_properties.py
        # checks them after every rule):
        # len(prompt_token_ids), fixed.
        self.prompt_len = len(prompt_token_ids)
        # len(prompt_token_ids) + len(output_token_ids): Scheduler.update, which alone
        # appends to output_token_ids.
        self.num_tokens = self.prompt_len
        self.sampling = sampling
        # The first block's parent in the prefix cache's hash chain: None for the base
        # model, the adapter's seed (shared/prefix_hash.py adapter_seed) for a LoRA request.
        self.prefix_seed: bytes | None = None
        self.status = RequestStatus.WAITING
        # Its order (scheduler/fairness/) in the queues and, by priority, the running list:
        # its priority, aged, and its client's virtual start; then its handle (arrival).
        self.client: str | None = None
        self.queue_key: tuple[int, int, int] = (0, 0, handle)
        # Requests admitted past it while the LoRA slot limit held it back (bounded).
        self.lora_passes = 0
        self.num_computed_tokens = 0
        self.finish_reason: str | None = None
        self.on_executor = False   # whether the executor holds this request's state
        # Tokens that steps in flight will sample, not yet reported: a step scheduled ahead
        # computes them on the executor, which appends its own samples.
        self.num_pending = 0
        self.admit_seq = -1        # order of first admission; kept across preemptions
        self.resumed_step = -1     # the step it last came back from a preemption
        self.num_preemptions = 0
        self.fork_children: list[Request] = []   # siblings that fork from this one (n > 1)
        self.prompt_logprobs_next = 1   # first prompt position not yet reported (recompute)
        self.arrival_time = time.monotonic()
        self.queue_s: float | None = None   # arrival to first admission
        # What may end it (scheduler/stop.py stop_triggers): set by the scheduler.
        self.stop_length_at = 0
        self.stop_ids: frozenset[int] = frozenset()
        self.stop_num_tokens = 0   # prompt_len + stop_length_at: num_tokens at that limit
        # Speculative decoding (scheduler/spec_decode.py): the draft cap of each step in
        # flight by step id, and their sum (positions past the verified ones those steps
        # may write); drafts proposed and accepted since the policy last judged, and the
        # step before which it proposes none; over its life, the steps that carried drafts
        # and the drafts accepted (the page map's mean accepted length).
        self.draft_steps: dict[int, int] = {}
        self.num_draft_slots = 0
        self.spec_proposed = 0
        self.spec_accepted = 0
        self.spec_paused_until = 0
        self.spec_steps = 0
        self.spec_accepted_total = 0

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.value}, "
                f"handle={self.handle}, computed={self.num_computed_tokens}/{self.num_tokens})")
