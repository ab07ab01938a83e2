"""Owns text: tokenizers, chat templates, validation, detokenization, gateways."""
