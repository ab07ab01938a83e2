"""Weight formats other than plain float: --quantization, pre-quantized checkpoints, GGUF."""
