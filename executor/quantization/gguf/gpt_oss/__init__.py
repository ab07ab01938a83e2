"""GGUF files of gpt-oss (`gpt-oss`): llama.cpp's converter splits the experts' fused gate/up
into two tensors, transposes them and repacks MXFP4 blocks into ggml's; this undoes it onto
executor/models/gpt_oss/'s parameters."""
