"""GGUF files of Gemma 4's text model (llama.cpp's `gemma4`): its metadata read back into the
config.json keys executor/models/gemma4/ reads, its tensors renamed to the checkpoint's."""
