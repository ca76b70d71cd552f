"""GRPO math: group-relative advantages, token log-probs, clipped policy-gradient loss, KL.

Shapes: ``B`` samples (= prompts x group size, samples of one prompt contiguous), ``L`` total
sequence length (prompt + response), ``T = L - 1`` next-token positions.
Source: GRPO (DeepSeekMath, Shao et al. 2024) group-normalised advantage; PPO clipped surrogate
(Schulman et al. 2017); k3 KL estimator (Schulman 2020).
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages ``A_i = (r_i - mean_g) / (std_g + eps)``.

    Args:
        rewards: FloatTensor ``[B]``, ``B = prompts x group_size``, each prompt's samples contiguous.
        group_size: samples per prompt (>= 2).
    Returns:
        FloatTensor ``[B]``; zero for a group whose rewards are all equal (no learning signal).
    Raises:
        ValueError: ``group_size < 2`` or ``B`` not a multiple of ``group_size``.
    """
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {group_size}")
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards are not a multiple of group_size={group_size}")
    r = rewards.float().view(-1, group_size)
    adv = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, keepdim=True) + eps)
    return adv.view(-1)


def response_mask(seq: torch.Tensor, prompt_len: int, eos_id: int) -> torch.Tensor:
    """Mask ``[B, T]`` of next-token positions that predict a response token up to the first eos.

    Position ``t`` predicts token ``t + 1``; response tokens start at index ``prompt_len``.
    Tokens after the first ``<eos>`` (padding) are masked out; ``<eos>`` itself is kept.
    """
    B, L = seq.shape
    resp = seq[:, prompt_len:]
    is_eos = (resp == eos_id).int()
    after_eos = (torch.cumsum(is_eos, dim=1) - is_eos) > 0  # strictly after the first eos
    mask = torch.zeros(B, L - 1, dtype=torch.float32)
    mask[:, prompt_len - 1 :] = (~after_eos).float()
    return mask


def token_logprobs(logits: torch.Tensor, seq: torch.Tensor) -> torch.Tensor:
    """Log-prob of each next token: ``[B, T]`` from logits ``[B, L, V]`` and tokens ``[B, L]``."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logp.gather(-1, seq[:, 1:].unsqueeze(-1)).squeeze(-1)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || ref): ``exp(ref - logp) - (ref - logp) - 1`` (>= 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def clipped_pg_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss (PPO surrogate with GRPO advantages), token-level mean.

    ``loss = mean_mask[-min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)] + kl_coef * mean_mask[k3]``
    with ``rho = exp(logp - old_logp)``.

    Args:
        logp, old_logp: ``[B, T]`` current / behaviour-policy token log-probs.
        advantages: ``[B]`` per-sample advantages (broadcast over tokens).
        mask: ``[B, T]`` float mask of response tokens.
        ref_logp: ``[B, T]`` reference-policy log-probs (KL term only when ``kl_coef > 0``).
    Returns:
        (scalar loss, stats ``{"pg_loss", "kl", "clip_frac"}``).
    """
    denom = mask.sum().clamp_min(1.0)
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(1)
    surr = torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv)
    pg = -(surr * mask).sum() / denom
    loss = pg
    kl = torch.zeros(())
    if ref_logp is not None and kl_coef > 0:
        kl = (kl_k3(logp, ref_logp) * mask).sum() / denom
        loss = loss + kl_coef * kl
    clipped = ((ratio - 1.0).abs() > clip_eps).float()
    stats = {"pg_loss": float(pg.detach()), "kl": float(kl.detach()), "clip_frac": float((clipped * mask).sum() / denom)}
    return loss, stats
