"""The names of this package's one server (conftest.py's `tiny_server`)."""

KEY = "sk-folio-openai"
MODEL = "tiny"
ALIAS = "org/tiny-alias"
