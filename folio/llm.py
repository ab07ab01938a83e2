"""The offline API, vLLM-style: `LLM(model=...).generate(prompts, params)`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from folio.engine import InProcessEngine
from frontend.tokenizer import load_tokenizer
from shared.config import EngineConfig
from shared.outputs import CompletionOutput, RequestOutput
from shared.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        if model is None:
            from folio.default_model import default_model_path

            model = str(default_model_path())
        self.config = EngineConfig(model=str(model), **engine_args)
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
        results: list[RequestOutput] = []
        children: dict[str, tuple[RequestOutput, int]] = {}
        try:
            for prompt, token_ids, sampling in zip(prompt_list, encoded, param_list):
                request_id = f"req-{self._counter}"
                self._counter += 1
                result = RequestOutput(request_id, prompt if isinstance(prompt, str) else None,
                                       token_ids)
                results.append(result)
                for index, sample_id in enumerate(
                        self.engine.add_request(request_id, token_ids, sampling)):
                    result.outputs.append(CompletionOutput(index, "", []))
                    children[sample_id] = (result, index)
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    result, index = children[output.request_id]
                    completion = result.outputs[index]
                    completion.token_ids.extend(output.new_token_ids)
                    if output.finished:
                        completion.finish_reason = output.finish_reason
        except BaseException:
            for result in results:
                self.engine.abort_request(result.request_id)
            raise
        for result in results:
            for completion in result.outputs:
                if self.tokenizer is not None:
                    completion.text = self.tokenizer.decode(completion.token_ids,
                                                            skip_special_tokens=True)
            result.finished = True
        return results

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
