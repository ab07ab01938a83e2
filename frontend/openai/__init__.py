"""OpenAI's API shapes: request fields, completions, log-probabilities, tools, errors."""
