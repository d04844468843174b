"""Which decoder layers copy: a per-layer induction score, to choose the layers a drafter keeps.

A drafter cut from S must copy names, ids and e-mails from the ticket into its tool calls.
In transformer LMs much of such copying is done by induction heads (a head at the second
occurrence of a token attends to the token that followed its first occurrence), reading what
a previous-token head in an earlier layer wrote there. This bench feeds ``--sequences``
random token sequences of ``--length`` tokens, each repeated twice, and reports per layer the
attention mass its best head puts, from each position of the second copy, on the position
right after the same token in the first copy (1.0: a perfect induction head; chance is about
1/position), and the mass its best head puts on the previous position. Nothing is trained;
one forward pass per sequence.

    python bench/copy_layers.py runs/quickstart/export/strong/merged --out runs/bench/copy_layers.json

Prints the layers ranked by score and a suggested ``from_layers`` list: the first
``--first`` layers, the ``--last`` last ones, and between them the best induction layers,
each with the best previous-token layer below it, up to ``--keep`` in all.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from specagent.engines.models import materialize
from specagent.runtime.provenance import versions


def head_scores(model, sequences: int, length: int, seed: int = 0) -> tuple[list[float], list[float]]:
    """Per layer, mean over sequences: the best head's induction attention mass, and the best
    head's previous-token attention mass (what an induction head composes with)."""
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(seed)
    queries = torch.arange(length + 1, 2 * length)  # second copy, from its 2nd token
    keys = queries - length + 1                      # the token after the same one in copy 1
    positions = torch.arange(1, 2 * length)
    induction, previous = [], []
    for _ in range(sequences):
        half = torch.randint(1000, vocab - 1000, (length,), generator=generator)
        with torch.no_grad():
            attentions = model(torch.cat([half, half]).unsqueeze(0), output_attentions=True).attentions
        # per layer [1, heads, T, T] -> the best head's mean mass on the target positions
        induction.append(torch.stack([a[0][:, queries, keys].mean(-1).max() for a in attentions]))
        previous.append(torch.stack([a[0][:, positions, positions - 1].mean(-1).max() for a in attentions]))
    return torch.stack(induction).mean(0).tolist(), torch.stack(previous).mean(0).tolist()


def suggest(induction: list[float], previous: list[float], keep: int, first: int, last: int) -> list[int]:
    """The first ``first`` and last ``last`` layers, then the middle layers by induction score,
    each followed by the best previous-token layer below it not kept yet, up to ``keep``."""
    n = len(induction)
    chosen = set(range(first)) | set(range(n - last, n))
    for i in sorted(range(first, n - last), key=lambda i: -induction[i]):
        below = [j for j in range(first, i) if j not in chosen]
        for layer in [i] + ([max(below, key=lambda j: previous[j])] if below else []):
            if len(chosen) < keep:
                chosen.add(layer)
    return sorted(chosen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model dir or a name specagent resolves (e.g. smollm2)")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--keep", type=int, default=10, help="layers in the suggested cut")
    parser.add_argument("--first", type=int, default=4, help="always keep this many first layers")
    parser.add_argument("--last", type=int, default=3, help="always keep this many last layers")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    model = AutoModelForCausalLM.from_pretrained(materialize(args.model), attn_implementation="eager",
                                                 dtype=torch.float32).eval()
    scores, previous = head_scores(model, args.sequences, args.length)
    ranked = sorted(range(len(scores)), key=lambda i: -scores[i])
    for i in ranked:
        print(f"layer {i:2d}  induction {scores[i]:.3f}  previous-token {previous[i]:.3f}")
    cut = suggest(scores, previous, args.keep, args.first, args.last)
    print("suggested from_layers:", cut)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"model": args.model, "sequences": args.sequences, "length": args.length,
                  "induction": scores, "previous_token": previous, "suggested": cut,
                  "git_sha": versions().get("git_sha")}
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
