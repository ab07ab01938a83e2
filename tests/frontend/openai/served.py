"""The names of this package's one server (conftest.py's `server`)."""

KEY = "sk-folio-openai"
MODEL = "tiny"
ALIAS = "org/tiny-alias"
