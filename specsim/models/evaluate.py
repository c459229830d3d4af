"""Held-out quality of a model and the exact acceptance between a target and a drafter.

β = Σ_x min(p(x), q(x)) = 1 − TV(p, q) is the probability that the exact verifier accepts one
drafted token at a position, averaged here over every position of held-out text (teacher forcing,
temperature 1 unless given). Averaging over positions overstates what chained steps achieve (see
DESIGN.md); it is the standard figure to compare drafters by, not a simulation input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specsim.models.transformer import DecoderModel


def windows(stream: torch.Tensor, length: int, max_windows: int) -> torch.Tensor:
    """Up to ``max_windows`` non-overlapping windows of ``length + 1`` ids (inputs plus
    next-token targets), spread evenly over the whole stream so that no single file (some are
    mostly data tables) dominates the figure."""
    available = (stream.numel() - 1) // length
    picks = torch.linspace(0, available - 1, min(available, max_windows)).round().long()
    return torch.stack([stream[i * length : i * length + length + 1] for i in picks.tolist()])


@torch.no_grad()
def logits_over(model: DecoderModel, batch: torch.Tensor, chunk: int = 8) -> torch.Tensor:
    """Cache-free causal logits for the input part of each window, in chunks of rows."""
    outs = [model(batch[i : i + chunk, :-1]) for i in range(0, batch.shape[0], chunk)]
    return torch.cat(outs)


def cross_entropy(logits: torch.Tensor, batch: torch.Tensor) -> float:
    """Mean next-token loss in nats per token."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1)).item()


def acceptance(
    target_logits: torch.Tensor, draft_logits: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Per-position β = Σ_x min(p(x), q(x)), shape of the logits without the vocabulary axis."""
    p = torch.softmax(target_logits.double() / temperature, dim=-1)
    q = torch.softmax(draft_logits.double() / temperature, dim=-1)
    return torch.minimum(p, q).sum(-1)


@torch.no_grad()
def evaluate_family(
    models: dict[str, DecoderModel], stream: torch.Tensor, length: int, max_windows: int
) -> dict:
    """Held-out loss of each model and mean β of every ordered (target, drafter) pair in which
    the target is the larger model."""
    batch = windows(stream, length, max_windows)
    logits = {name: logits_over(m, batch) for name, m in models.items()}
    report = {
        "held_out_tokens": int(batch[:, 1:].numel()),
        "loss_nats_per_byte": {n: round(cross_entropy(lg, batch), 4) for n, lg in logits.items()},
        "beta": {},
    }
    names = sorted(models, key=lambda n: -models[n].config.param_count())
    for i, big in enumerate(names):
        for small in names[i + 1 :]:
            beta = acceptance(logits[big], logits[small]).mean().item()
            report["beta"][f"{big} <- {small}"] = round(beta, 4)
    return report
