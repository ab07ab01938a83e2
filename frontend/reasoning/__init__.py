"""Reasoning text separated from the answer (--reasoning-parser): think.py reads
`<think>…</think>` models (qwen3, deepseek_r1), harmony.py gpt-oss's channels; parsers.py
picks one per request and checks the name and the tokenizer at start; tokens.py counts the
reasoning's tokens."""
