"""The reasoning readers (frontend/reasoning/): the whole-text split, and a stream cut at
every point (markers across deltas included) giving exactly the same split."""

from __future__ import annotations

import itertools

import pytest

from folio.frontend.reasoning.parsers import Reasoning, prompt_opens

HARMONY = ("<|channel|>analysis<|message|>Think: 2 < 3.<|end|>"
           "<|start|>assistant<|channel|>final<|message|>Yes, 2 <| 3.<|return|>")


def streamed(reasoning: Reasoning, pieces: list[str]) -> tuple[str | None, str]:
    reader = reasoning.reader()
    thought, answer = "", ""
    for piece in pieces:
        r, a = reader.feed(piece)
        thought, answer = thought + r, answer + a
    r, a = reader.finish()
    return (thought + r if reader.reasoned else None), answer + a


def cuts(text: str, parts: int) -> list[list[str]]:
    """`text` cut into `parts` pieces at every choice of points (empty pieces included)."""
    result = []
    for points in itertools.combinations_with_replacement(range(len(text) + 1), parts - 1):
        bounds = (0, *points, len(text))
        result.append([text[a:b] for a, b in zip(bounds, bounds[1:])])
    return result


CASES = [
    # (parser, prompt opened <think>, output, reasoning, answer)
    ("qwen3", False, "<think>\nI add.\n</think>\n\nIt is 4.", "I add.", "It is 4."),
    ("qwen3", False, "  <think>a</think>b", "a", "b"),
    ("qwen3", False, "It is 4.", None, "It is 4."),
    ("qwen3", False, " <thin", None, " <thin"),          # looked like <think>, was not
    ("qwen3", False, "\n\nplain", None, "\n\nplain"),   # no reasoning: text as written
    ("qwen3", True, "I add.\n</think>\n\nIt is 4.", "I add.", "It is 4."),
    ("qwen3", True, "still thinking </thi", "still thinking </thi", ""),   # cut short
    ("qwen3", True, "a < b </ c</think>x </think> y", "a < b </ c", "x </think> y"),
    ("deepseek_r1", False, "I add.</think>It is 4.", "I add.", "It is 4."),
    ("deepseek_r1", False, "<think>\nI add.</think>4", "I add.", "4"),
    ("deepseek_r1", False, "no end", "no end", ""),
    ("gpt_oss", False, HARMONY, "Think: 2 < 3.", "Yes, 2 <| 3."),
    ("gpt_oss", False, "plain text", None, "plain text"),
    ("gpt_oss", False, "<|channel|>analysis<|message|>cut sho", "cut sho", ""),
    ("gpt_oss", False, "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>"
     "commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Done", "a", "Let me look.Done"),
]


@pytest.mark.parametrize("parser,opened,output,reasoning,answer", CASES)
def test_whole_split(parser, opened, output, reasoning, answer):
    assert Reasoning(parser, opened).split(output) == (reasoning, answer)


@pytest.mark.parametrize("parser,opened,output,reasoning,answer", CASES)
def test_every_two_and_three_piece_stream_splits_the_same(parser, opened, output, reasoning,
                                                          answer):
    split = Reasoning(parser, opened)
    for parts in (2, 3):
        for pieces in cuts(output, parts):
            assert streamed(split, pieces) == (reasoning, answer), pieces


def test_a_stream_holds_back_only_what_may_be_a_marker():
    reader = Reasoning("qwen3", True).reader()
    assert reader.feed("I add </") == ("I add", "")      # " </" may begin </think>
    assert reader.feed("b> ok") == (" </b> ok", "")      # it did not
    assert reader.feed("</think>\n") == ("", "")
    assert reader.feed("\nIt") == ("", "It")
    assert reader.finish() == ("", "")
    harmony = Reasoning("gpt_oss").reader()
    assert harmony.feed("<|channel|>analysis<|mess") == ("", "")
    assert harmony.feed("age|>why<|e") == ("why", "")
    assert harmony.in_reasoning
    assert harmony.feed("nd|><|start|>assistant<|channel|>final<|message|>so") == ("", "so")
    assert not harmony.in_reasoning


@pytest.mark.parametrize("tail,opened", [
    ("<|im_start|>assistant\n<think>\n", True), ("<|im_start|>assistant\n", False),
    ("assistant\n<think>\n\n</think>\n\n", False)])
def test_prompt_opens_think(tail, opened):
    assert prompt_opens("qwen3", tail) is opened
    assert prompt_opens("gpt_oss", tail) is False
