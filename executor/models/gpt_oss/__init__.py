"""gpt-oss (GptOssForCausalLM): the shared decoder with attention sinks and alternating
sliding/full layers, plus its own MoE (moe.py) and the MXFP4 expert format of its released
checkpoints (mxfp4.py)."""
