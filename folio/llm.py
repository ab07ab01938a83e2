"""The offline API, vLLM-style: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from folio.engine import InProcessEngine
from folio.pooling import embed, score_pairs
from folio.preflight import check_engine
from folio.frontend.input_processor import InputProcessor, ModelFacts, ProcessedPrompt
from folio.shared.hf_tokenizer import load_tokenizer
from folio.frontend.output_loop import OutputEvents, OutputLoop
from folio.frontend.output_processor import RequestState, SampleState, vllm_logprob
from folio.shared.config import EngineConfig
from folio.shared.outputs import CompletionOutput, RequestOutput
from folio.shared.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        if model is None:
            from folio.default_model import default_model_path

            model = str(default_model_path())
        self.config = EngineConfig(model=str(model), **engine_args)
        check_engine(self.config)   # a SettingError (ValueError) before any weight is read
        self.engine = InProcessEngine(self.config)
        self.tokenizer = None if self.config.skip_tokenizer_init \
            else load_tokenizer(self.config.tokenizer_path)
        # The server's input checks (frontend/input_processor.py), against this engine.
        self.inputs = InputProcessor(self.tokenizer)
        self.facts = ModelFacts(self.engine.executor.model_config.vocab_size,
                                self.engine.scheduler.config.max_model_len,
                                self.config.max_logprobs, self.config.max_n)
        self._counter = 0

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 params: SamplingParams | Sequence[SamplingParams] | None = None,
                 lora: str | Sequence[str | None] | None = None) -> list[RequestOutput]:
        """`lora`: the LoRA adapter to run with, by name (docs/lora.md): one for every
        prompt, or one (or None, the base model) per prompt."""
        if self.engine.executor.pooling_task is not None:
            raise ValueError("this engine runs the pooling runner: use LLM.embed or "
                             "LLM.score; it does not generate")
        prompt_list = _as_prompt_list(prompts)
        if params is None:
            params = SamplingParams()
        param_list = [params] * len(prompt_list) if isinstance(params, SamplingParams) \
            else list(params)
        if len(param_list) != len(prompt_list):
            raise ValueError(f"got {len(param_list)} SamplingParams for {len(prompt_list)} "
                             "prompts; pass one, or one per prompt")
        if lora is not None:
            names = [lora] * len(prompt_list) if isinstance(lora, str) else list(lora)
            if len(names) != len(prompt_list):
                raise ValueError(f"got {len(names)} adapter names for {len(prompt_list)} "
                                 "prompts; pass one, or one per prompt")
            for name in set(names) - {None}:
                self._check_lora_name(name)
            param_list = [p if name is None else replace(p, lora=name)
                          for p, name in zip(param_list, names)]
        for p in param_list:
            if p.lora is not None:
                self._check_lora_name(p.lora)
        # Tokenize and validate everything before queueing anything.
        prepared = [self._prepare(p, sampling) for p, sampling in zip(prompt_list, param_list)]
        results: list[RequestOutput] = []
        states: list[RequestState] = []
        # Nothing to stream: the states hold every result when the engine is done.
        outputs: OutputLoop[None] = OutputLoop(OutputEvents(), self.engine.abort_request)
        try:
            for prompt, ready, sampling in zip(prompt_list, prepared, param_list):
                token_ids = ready.ids
                request_id = f"req-{self._counter}"
                self._counter += 1
                results.append(RequestOutput(
                    request_id, prompt if isinstance(prompt, str) else None, token_ids))
                state = RequestState(self.tokenizer, sampling, token_ids, vllm_logprob,
                                     ready.stops)
                states.append(state)
                outputs.track(request_id, None, state,
                              self.engine.add_request(request_id, token_ids, sampling))
            while self.engine.has_unfinished_requests():
                outputs.feed(self.engine.step())   # an earlier call's abort: not tracked
        except BaseException:
            for result in results:
                self.engine.abort_request(result.request_id)
            raise
        for result, state in zip(results, states):
            result.outputs = [_completion(sample) for sample in state.samples]
            if state.prompt_logprobs is not None:
                result.prompt_logprobs = [None, *state.prompt_logprobs]
            result.finished = True
        return results

    def embed(self, prompts: Prompt | Sequence[Prompt], dimensions: int | None = None):
        """Embeddings on the pooling runner (folio/pooling.py): one EmbeddingRequestOutput
        per prompt, its `outputs.embedding` pooled, truncated to `dimensions` (where the
        model declares Matryoshka sizes) and normalised as the model says."""
        return embed(self, _as_prompt_list(prompts), dimensions)

    def score(self, text_1: str | Sequence[str], text_2: str | Sequence[str],
              instruction: str | None = None):
        """Relevance scores on the pooling runner (folio/pooling.py): a reranker's
        probability of its `for` token, or an embedding model's cosine similarity; one
        ScoringRequestOutput per pair (one text_1 against each text_2, or pairs in order)."""
        return score_pairs(self, text_1, text_2, instruction)

    def _prepare(self, prompt: Prompt, sampling: SamplingParams) -> ProcessedPrompt:
        """The input processor's checks, as the server runs them (an InputError is a
        ValueError), then the grammar (the server admits it apart, within a budget)."""
        if isinstance(prompt, str):
            ready = self.inputs.process(sampling, self.facts, prompt=prompt)
        elif isinstance(prompt, (list, tuple)) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ready = self.inputs.process(sampling, self.facts, token_ids=list(prompt))
        else:
            raise TypeError("a prompt must be a string or a list of token ids")
        if sampling.structured_output is not None:
            from folio.shared.structured_output import grammar_error

            error = grammar_error(sampling.structured_output)
            if error is not None:
                raise ValueError(f"structured_output: {error}")
        return ready

    def stats(self) -> dict[str, int | float]:
        return self.engine.stats()

    # ---- LoRA adapters (docs/lora.md) ---------------------------------------------------

    def load_lora(self, name: str, path: str) -> None:
        """Load a PEFT adapter directory under `name`; a ValueError names why not, and
        nothing of it is kept."""
        self._lora_registry().load(name, str(path))
        self.engine.scheduler.loras.add(name)

    def unload_lora(self, name: str) -> None:
        """Unload adapter `name` (refused while unfinished requests use it: none can be
        here between generate calls)."""
        registry = self._lora_registry()
        running = self.engine.scheduler.lora_requests(name)
        if running:
            raise ValueError(f"adapter {name!r} has {running} unfinished request(s)")
        registry.unload(name)
        self.engine.scheduler.forget_lora(name)

    def list_loras(self) -> list[str]:
        return self._lora_registry().names_loaded()

    def _lora_registry(self):
        registry = self.engine.executor.lora
        if registry is None:
            raise ValueError("LoRA adapters are off: make the LLM with enable_lora=True")
        return registry

    def _check_lora_name(self, name: str) -> None:
        if not isinstance(name, str) or name not in self._lora_registry().paths:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded (loaded: "
                             f"{', '.join(self._lora_registry().names_loaded()) or 'none'})")

    def close(self) -> None:
        """Stop the tensor-parallel ranks this LLM started (also done when it is collected
        or the process exits)."""
        self.engine.close()


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [list(prompts)]
    return list(prompts)


def _completion(sample: SampleState) -> CompletionOutput:
    return CompletionOutput(sample.index, sample.text, sample.token_ids, sample.finish_reason,
                            sample.logprobs, sample.cumulative_logprob)
