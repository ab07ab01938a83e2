"""The offline API, vLLM-style: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from folio.engine import InProcessEngine
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
                 params: SamplingParams | Sequence[SamplingParams] | None = None
                 ) -> list[RequestOutput]:
        prompt_list = _as_prompt_list(prompts)
        if params is None:
            params = SamplingParams()
        param_list = [params] * len(prompt_list) if isinstance(params, SamplingParams) \
            else list(params)
        if len(param_list) != len(prompt_list):
            raise ValueError(f"got {len(param_list)} SamplingParams for {len(prompt_list)} "
                             "prompts; pass one, or one per prompt")
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
