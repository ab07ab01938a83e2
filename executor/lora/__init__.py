"""LoRA adapters: files in PEFT's format, the registry, and the layers that apply them."""
