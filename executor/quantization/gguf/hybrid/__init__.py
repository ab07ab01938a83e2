"""GGUF files of the hybrid families (LFM2, Qwen3.5 and their MoE variants; Qwen3-Next's
are refused): llama.cpp's converter renames and transforms their tensors; this undoes it
onto executor/models/hybrid/'s parameters."""
