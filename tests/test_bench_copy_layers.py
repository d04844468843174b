"""bench/copy_layers.py: the per-layer induction and previous-token scores, and the suggested cut."""

from types import SimpleNamespace

import torch

from tests.helpers.bench import load_bench


class PatternModel:
    """Three layers of one head each: uniform causal attention, a perfect induction head, a
    perfect previous-token head."""

    config = SimpleNamespace(vocab_size=5000)

    def __call__(self, ids, output_attentions=True):
        total = ids.shape[1]
        half = total // 2
        uniform = torch.tril(torch.ones(total, total))
        uniform = uniform / uniform.sum(-1, keepdim=True)
        induction = torch.eye(total)
        for q in range(half + 1, total):
            induction[q] = 0
            induction[q, q - half + 1] = 1
        previous = torch.zeros(total, total)
        previous[0, 0] = 1
        for q in range(1, total):
            previous[q, q - 1] = 1
        return SimpleNamespace(attentions=[a[None, None] for a in (uniform, induction, previous)])


def test_each_head_is_found_in_its_layer():
    bench = load_bench("copy_layers")
    induction, previous = bench.head_scores(PatternModel(), sequences=2, length=16)
    assert induction[1] == 1.0 and previous[2] == 1.0
    assert induction[0] < 0.2 and induction[2] == 0.0   # chance, and a head that never looks back far
    assert previous[1] < 0.2 and previous[0] < 0.2


def test_the_suggested_cut_keeps_the_ends_then_induction_layers_with_a_previous_token_layer_below():
    bench = load_bench("copy_layers")
    induction, previous = [0.0] * 30, [0.1] * 30
    induction[17], induction[18], induction[23] = 0.8, 0.9, 0.5
    previous[16], previous[11] = 0.9, 0.8
    assert bench.suggest(induction, previous, keep=10, first=4, last=3) == [0, 1, 2, 3, 16, 17, 18, 27, 28, 29]
    assert bench.suggest(induction, previous, keep=11, first=4, last=3) == [0, 1, 2, 3, 11, 16, 17, 18, 27, 28, 29]
    assert bench.suggest(induction, previous, keep=5, first=4, last=3) == [0, 1, 2, 3, 27, 28, 29]  # the ends first
