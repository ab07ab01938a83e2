"""The offline API, vLLM-style: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from folio.engine import InProcessEngine
from folio.preflight import check_engine
from frontend.tokenizer import load_tokenizer
from shared.config import EngineConfig
from frontend.output_text import OutputText
from shared.outputs import CompletionOutput, EngineOutput, Logprob, RequestOutput
from shared.sampling_params import SamplingParams, check_against_model

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
        encoded = [self._encode(p) for p in prompt_list]
        for sampling in param_list:
            self._check(sampling)
        results: list[RequestOutput] = []
        samples: dict[str, _Sample] = {}
        try:
            for prompt, token_ids, sampling in zip(prompt_list, encoded, param_list):
                request_id = f"req-{self._counter}"
                self._counter += 1
                result = RequestOutput(request_id, prompt if isinstance(prompt, str) else None,
                                       token_ids)
                results.append(result)
                if sampling.prompt_logprobs is not None:
                    result.prompt_logprobs = [None]
                for index, sample_id in enumerate(
                        self.engine.add_request(request_id, token_ids, sampling)):
                    completion = CompletionOutput(index, "", [])
                    result.outputs.append(completion)
                    samples[sample_id] = _Sample(completion, sampling, self.tokenizer, result)
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    sample = samples.get(output.request_id)   # None: an earlier call's abort
                    if sample is not None and sample.add(output):   # a stop string ended it: free it now
                        self.engine.abort_request(output.request_id)
        except BaseException:
            for result in results:
                self.engine.abort_request(result.request_id)
            raise
        for result in results:
            result.finished = True
        return results

    def _check(self, sampling: SamplingParams) -> None:
        vocab = self.engine.executor.model_config.vocab_size
        check_against_model(sampling, vocab, self.config.max_logprobs, self.config.max_n)
        if sampling.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer; this LLM was made with "
                             "skip_tokenizer_init=True")
        if sampling.structured_output is not None:
            from shared.structured_output import grammar_error

            error = grammar_error(sampling.structured_output)
            if error is not None:
                raise ValueError(f"structured_output: {error}")

    def stats(self) -> dict[str, int | float]:
        return self.engine.stats()

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("text prompts need a tokenizer; this LLM was made with "
                                 "skip_tokenizer_init=True, so pass token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, (list, tuple)) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise TypeError("a prompt must be a string or a list of token ids")


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [list(prompts)]
    return list(prompts)


class _Sample:
    """One sample's output as it grows: tokens, text, logprobs, finish."""

    def __init__(self, completion: CompletionOutput, params: SamplingParams,
                 tokenizer: Any, request: RequestOutput) -> None:
        self.completion = completion
        self.request = request
        self.tokenizer = tokenizer
        self.text = OutputText(tokenizer, params) if tokenizer is not None else None
        self.done = False
        if params.logprobs is not None:
            completion.logprobs = []
            completion.cumulative_logprob = 0.0

    def add(self, output: EngineOutput) -> bool:
        """Apply one step's output; True when a stop string just ended the sample."""
        if self.done:
            return False
        if output.prompt_logprobs is not None and self.request.prompt_logprobs is not None:
            prompt = self.request.prompt_token_ids
            start = len(self.request.prompt_logprobs)
            for offset, entry in enumerate(output.prompt_logprobs):
                self.request.prompt_logprobs.append(
                    logprob_dict(prompt[start + offset], entry, self.tokenizer))
        completion = self.completion
        completion.token_ids.extend(output.new_token_ids)
        if output.logprobs is not None and completion.logprobs is not None:
            for token_id, entry in zip(output.new_token_ids, output.logprobs):
                completion.logprobs.append(logprob_dict(token_id, entry, self.tokenizer))
                completion.cumulative_logprob += entry[0]
        if self.text is not None:
            self.text.add(output.new_token_ids, final=output.finished)
            completion.text = self.text.text
            if self.text.stopped:
                completion.finish_reason = "stop"
                self.done = True
                return not output.finished
        if output.finished:
            completion.finish_reason = output.finish_reason
            self.done = True
        return False


def logprob_dict(token_id: int, entry, tokenizer: Any) -> dict[int, Logprob]:
    """vLLM's shape: the sampled token and the top k, each with logprob, rank and text."""
    logprob, rank, top_ids, top_logprobs = entry

    def text(tid: int) -> str | None:
        return None if tokenizer is None else tokenizer.decode([tid])

    result = {tid: Logprob(lp, i + 1, text(tid))
              for i, (tid, lp) in enumerate(zip(top_ids, top_logprobs))}
    if token_id not in result:
        result[token_id] = Logprob(logprob, rank, text(token_id))
    return result
