"""The weights one decode step reads (executor/weight_bytes.py): a tied float lm_head reads the
embedding matrix once; an untied or quantized lm_head reads its own weight and the embedding
lookup a row, which is not counted."""

from __future__ import annotations

from torch import nn

from folio.executor.weight_bytes import weight_bytes_per_step


class Tiny(nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(100, 8)
        self.layer = nn.Linear(8, 8, bias=True)
        self.lm_head = nn.Linear(8, 100, bias=False)
        if tied:
            self.lm_head.weight = self.embed_tokens.weight


def test_tied_head_counts_the_embedding_once():
    assert weight_bytes_per_step(Tiny(tied=True)) == 4 * (100 * 8 + 8 * 8 + 8)


def test_untied_head_skips_the_embedding_matrix():
    assert weight_bytes_per_step(Tiny(tied=False)) == 4 * (8 * 8 + 8 + 100 * 8)
    model = Tiny(tied=False)
    model.lm_head = nn.Linear(8, 50, bias=False)      # the head's own size, not the table's
    assert weight_bytes_per_step(model) == 4 * (8 * 8 + 8 + 50 * 8)
