"""An in-process engine: the scheduler and the executor, stepping together (what a step is:
`Scheduler.plan_for_executor`, as in the scheduler process)."""

from __future__ import annotations

from folio.executor.executor import Executor
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import EngineConfig, SchedulerConfig
from folio.shared.outputs import EngineOutput, StepOutputs
from folio.shared.sampling_params import SamplingParams


class InProcessEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.executor = Executor(config)
        self.scheduler = Scheduler(SchedulerConfig.from_engine(config, self.executor.capacity))

    def add_request(self, request_id: str, prompt_token_ids: list[int],
                    sampling: SamplingParams) -> list[str]:
        return self.scheduler.add_request(request_id, prompt_token_ids, sampling)

    def abort_request(self, request_id: str) -> bool:
        return self.scheduler.abort_request(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> StepOutputs | list[EngineOutput]:
        plan = self.scheduler.plan_for_executor()
        if plan is None:
            return self.scheduler.take_pending_outputs()
        try:
            result = self.executor.execute(plan)
        except BaseException:
            self.scheduler.discard_unconfirmed()   # the blocks it was to write hold garbage
            raise
        return self.scheduler.update(plan, result)

    def stats(self) -> dict[str, int | float]:
        return self.scheduler.stats()
