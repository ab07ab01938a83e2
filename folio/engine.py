"""An in-process engine: the scheduler and the executor, stepping together (what a step is:
`Scheduler.plan_for_executor`, as in the scheduler process).

With tensor_parallel_size N this process is rank 0: it starts ranks 1..N-1 on this host
(executor/parallel/group.py, as `folio executor` does) and hands each plan to them, encoded as the
scheduler process would send it, before running it itself."""

from __future__ import annotations

import os
import weakref

from folio.executor.executor import Executor
from folio.shared.protocol import messages as m
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import EngineConfig, SchedulerConfig
from folio.shared.outputs import EngineOutput, StepOutputs
from folio.shared.sampling_params import SamplingParams


class InProcessEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.ranks = None
        if config.tensor_parallel_size > 1:
            from folio.executor.parallel.group import RankGroup

            if config.nnodes > 1:
                raise ValueError("nnodes > 1 runs in `folio serve` and `folio executor "
                                 "--headless`: folio.LLM starts its ranks on this host")
            cores = os.sched_getaffinity(0)   # rank 0 takes its share while the group runs
            self.ranks = RankGroup(config)
            # The ranks stop with this engine, or with the process.
            self._stop_ranks = weakref.finalize(self, _stop_group, self.ranks, cores)
            try:
                self.executor = Executor(self.ranks.engine, self.ranks.tp)
            except BaseException:
                self.close()
                raise
        else:
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
            if self.ranks is not None:
                self.ranks.check()   # a rank that died: fail here, not inside a collective
                self.ranks.send(m.encode_plan(plan))
            result = self.executor.execute(plan)
        except BaseException:
            self.scheduler.discard_unconfirmed()   # the blocks it was to write hold garbage
            raise
        return self.scheduler.update(plan, result)

    def stats(self) -> dict[str, int | float]:
        return self.scheduler.stats()

    def close(self) -> None:
        """Stop the tensor-parallel ranks (nothing to do for one process)."""
        if self.ranks is not None:
            self._stop_ranks()


def _stop_group(ranks, cores: set[int]) -> None:
    ranks.tp.close()   # another group may start in this process
    ranks.stop()
    os.sched_setaffinity(0, cores)
