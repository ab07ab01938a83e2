"""The command line: every engine setting is a flag, and flags round-trip to the config."""

from __future__ import annotations

import pytest

from folio.cli import build_parser
from folio.flags import config_flags, config_of
from folio.scheduler.scheduler import Scheduler
from folio.shared.config import EngineConfig, SchedulerConfig
from folio.shared.sampling_params import SamplingParams


def test_engine_flags_round_trip():
    args = build_parser().parse_args([
        "executor", "--scheduler-address", "ipc:///tmp/x.sock", "--num-swap-blocks", "8",
        "--num-kv-blocks", "100", "--max-model-len", "256", "--no-enable-prefix-caching",
        "--preemption-mode", "auto", "--dtype", "float32", "--tokenizer", "/tok"])
    config = config_of(EngineConfig, args, model="/model")
    assert (config.num_swap_blocks, config.num_kv_blocks, config.max_model_len) == (8, 100, 256)
    assert config.enable_prefix_caching is False and config.preemption_mode == "auto"
    assert config.tokenizer == "/tok"
    again = config_of(EngineConfig, build_parser().parse_args(
        ["executor", "--scheduler-address", "ipc:///tmp/x.sock",
         *config_flags(config, skip=("model",))]), model="/model")
    assert again == config


def test_bad_flag_values_are_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--preemption-mode", "sometimes"])
    assert "invalid choice" in capsys.readouterr().err


def test_scheduler_checks_n_and_logprobs_itself():
    scheduler = Scheduler(SchedulerConfig(num_kv_blocks=8, block_size=4, max_num_seqs=4,
                                          max_num_batched_tokens=16, max_model_len=32,
                                          vocab_size=100, max_n=4, max_logprobs=5))
    with pytest.raises(ValueError, match="n must be <= 4"):
        scheduler.add_request("a", [1, 2], SamplingParams(n=5))
    with pytest.raises(ValueError, match=r"logprobs must be in \[0, 5\]"):
        scheduler.add_request("b", [1, 2], SamplingParams(logprobs=6))
    assert not scheduler.requests and scheduler.pool.num_free == 8
