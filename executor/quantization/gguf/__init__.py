"""llama.cpp's GGUF files: metadata, tensor names, quantized and dequantized weights."""
