"""A model's NativeStep, counting its calls (the tests' proof that it ran)."""


class CountingStep:
    def __init__(self, step) -> None:
        self.step, self.max_tokens, self.calls = step, step.max_tokens, 0

    def __call__(self, *args):
        self.calls += 1
        return self.step(*args)
