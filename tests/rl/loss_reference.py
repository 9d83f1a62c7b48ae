"""Independent float64 reference implementations of every loss, written from the papers' formulas with plain
loops over sequences and tokens. They share no code with forge_exp.rl.losses; autograd through the loops gives
the reference gradient.

Arguments: lp, blp, ref, ent are [B, T] float64 tensors (lp requires grad), adv is [B] (or [B][T] nested for
token-level advantages), mask is [B, T] bool. `blp` is whatever the family's ratio is taken against (the behaviour
logprobs, or the anchor a rollout correction picks), `weight` a dict (i, t) → the correction's weight on the policy
term (None: 1).
"""

from __future__ import annotations

import math

import torch


def sigmoid(x):
    return 1.0 / (1.0 + torch.exp(-x))


def clip(x, low, high):
    """clip(x, low, high); a None bound is no bound. Python min/max keep autograd on the chosen branch."""
    if high is not None:
        x = min(x, torch.tensor(high, dtype=torch.float64))
    if low is not None:
        x = max(x, torch.tensor(low, dtype=torch.float64))
    return x


def real_tokens(mask, i):
    return [t for t in range(mask.shape[1]) if bool(mask[i, t])]


def aggregate(per_token, mask, agg, horizon=None):
    """per_token: dict (i, t) → scalar loss term. GRPO: 1/G Σ_i 1/|o_i| Σ_t; DAPO: 1/Σ|o_i| Σ_i Σ_t;
    Dr. GRPO: 1/(G·L) Σ_i Σ_t. Rows without real tokens are not sequences (seq_mean) but count in G (fixed)."""
    B = mask.shape[0]
    zero = torch.zeros((), dtype=torch.float64)
    if agg == "seq_mean":
        rows = []
        for i in range(B):
            toks = real_tokens(mask, i)
            if toks:
                rows.append(sum((per_token[i, t] for t in toks), zero) / len(toks))
        return sum(rows, zero) / max(len(rows), 1)
    terms = [per_token[i, t] for i in range(B) for t in real_tokens(mask, i)]
    if agg == "token_mean":
        return sum(terms, zero) / max(len(terms), 1)
    if agg == "fixed_horizon":
        return sum(terms, zero) / (B * horizon)
    raise ValueError(agg)


def k3(lp, ref):
    """DeepSeekMath eq. 4: π_ref/π_θ − log(π_ref/π_θ) − 1."""
    return torch.exp(ref - lp) - (ref - lp) - 1.0


def regularised(per_token, lp, ref, ent, mask, beta, ent_coef):
    for (i, t), v in list(per_token.items()):
        if beta:
            v = v + beta * k3(lp[i, t], ref[i, t])
        if ent_coef:
            v = v - ent_coef * ent[i, t]
        per_token[i, t] = v
    return per_token


def weighed(per_token, weight):
    return per_token if weight is None else {k: weight[k] * v for k, v in per_token.items()}


def correction(lp, blp, mask, mode, cap):
    """Rollout correction from its formulas: ρ = π_train/π_gen with π_train = lp (detached), π_gen = blp.
    → (anchor [B, T], weight dict, kept mask). tis: anchor π_train, w = min(ρ, C). mis: anchor π_train, w = ρ
    inside [1/C, C], the token dropped outside. seq_mask: anchor π_gen, w = 1, a row dropped when its geometric
    mean ratio exp(1/n Σ log ρ) leaves [1/C, C]. none: anchor π_gen, w = 1."""
    keep = mask.clone()
    anchor = lp.detach().clone() if mode in ("tis", "mis") else blp
    weight = {}
    for i in range(mask.shape[0]):
        toks = real_tokens(mask, i)
        rho = {t: math.exp(float(lp[i, t].detach()) - float(blp[i, t])) for t in toks}
        if mode == "seq_mask" and toks:
            geo = math.exp(sum(math.log(rho[t]) for t in toks) / len(toks))
            if not 1 / cap <= geo <= cap:
                keep[i] = False
        for t in toks:
            if mode == "tis":
                weight[i, t] = min(rho[t], cap)
            elif mode == "mis" and 1 / cap <= rho[t] <= cap:
                weight[i, t] = rho[t]
            elif mode == "mis":
                keep[i, t] = False
            else:
                weight[i, t] = 1.0
    return anchor, weight, keep


def grpo(lp, blp, adv, mask, *, clip_low=0.2, clip_high=0.2, dual_clip=None, beta=0.0, ref=None, ent=None,
         ent_coef=0.0, agg="seq_mean", horizon=None, weight=None):
    """GRPO eq. 3 (DeepSeekMath) per token: −[min(r·A, clip(r, 1−ε_l, 1+ε_h)·A) − β·KL]; dual clip (Ye et al.
    2020): for A < 0, max(that min, c·A)."""
    per_token = {}
    for i in range(mask.shape[0]):
        for t in real_tokens(mask, i):
            r = torch.exp(lp[i, t] - blp[i, t])
            a = float(adv[i])
            obj = min(r * a, clip(r, None if clip_low is None else 1 - clip_low,
                                  None if clip_high is None else 1 + clip_high) * a)
            if dual_clip is not None and a < 0:
                obj = max(obj, torch.tensor(dual_clip * a, dtype=torch.float64))
            per_token[i, t] = -obj
    return aggregate(regularised(weighed(per_token, weight), lp, ref, ent, mask, beta, ent_coef), mask, agg, horizon)


def gspo(lp, blp, adv, mask, *, clip_low=3e-4, clip_high=4e-4):
    """GSPO eq. 5-7: s_i = exp(1/|y_i| Σ_t log r_it); 1/G Σ_i −min(s_i·A_i, clip(s_i)·A_i)."""
    rows = []
    for i in range(mask.shape[0]):
        toks = real_tokens(mask, i)
        if not toks:
            continue
        s = torch.exp(sum(lp[i, t] - blp[i, t] for t in toks) / len(toks))
        a = float(adv[i])
        rows.append(-min(s * a, clip(s, 1 - clip_low, 1 + clip_high) * a))
    return sum(rows) / max(len(rows), 1)


def gspo_token(lp, blp, adv_bt, mask, *, clip_low=3e-4, clip_high=4e-4):
    """GSPO-token eq. 13-14: s_it = sg[s_i]·π(y_t)/sg[π(y_t)]; 1/G Σ_i 1/|y_i| Σ_t −min(s_it·A_it, clip(s_it)·A_it)."""
    rows = []
    for i in range(mask.shape[0]):
        toks = real_tokens(mask, i)
        if not toks:
            continue
        s_i = math.exp(sum(float(lp[i, t].detach() - blp[i, t]) for t in toks) / len(toks))
        terms = []
        for t in toks:
            s_it = s_i * torch.exp(lp[i, t] - lp[i, t].detach())
            a = float(adv_bt[i][t])
            terms.append(-min(s_it * a, clip(s_it, 1 - clip_low, 1 + clip_high) * a))
        rows.append(sum(terms) / len(toks))
    return sum(rows) / max(len(rows), 1)


def cispo(lp, blp, adv, mask, *, clip_low=None, clip_high=0.28, agg="token_mean", weight=None):
    """MiniMax-M1 eq. 4: −1/Σ|o_i| Σ_i Σ_t sg(clip(r_it, 1−ε_l, 1+ε_h))·A_i·log π_θ(o_it)."""
    per_token = {}
    for i in range(mask.shape[0]):
        for t in real_tokens(mask, i):
            r = math.exp(float(lp[i, t].detach() - blp[i, t]))
            w = min(r, 1 + clip_high) if clip_high is not None else r
            w = max(w, 1 - clip_low) if clip_low is not None else w
            per_token[i, t] = -w * float(adv[i]) * lp[i, t]
    return aggregate(weighed(per_token, weight), mask, agg)


def sapo(lp, blp, adv, mask, *, tau_pos=1.0, tau_neg=1.05, agg="seq_mean", weight=None):
    """SAPO: J = 1/G Σ_i 1/|y_i| Σ_t f(r_it)·A_i, f(r) = (4/τ)·σ(τ(r − 1)), τ = τ_pos if A > 0 else τ_neg."""
    per_token = {}
    for i in range(mask.shape[0]):
        a = float(adv[i])
        tau = tau_pos if a > 0 else tau_neg
        for t in real_tokens(mask, i):
            r = torch.exp(lp[i, t] - blp[i, t])
            per_token[i, t] = -(4.0 / tau) * sigmoid(tau * (r - 1.0)) * a
    return aggregate(weighed(per_token, weight), mask, agg)


def reinforce(lp, blp, adv, mask, *, agg="token_mean", weight=None):
    """REINFORCE: −sg(w)·A·log π (w: the correction's weight, else 1)."""
    per_token = {(i, t): -float(adv[i]) * lp[i, t] for i in range(mask.shape[0]) for t in real_tokens(mask, i)}
    return aggregate(weighed(per_token, weight), mask, agg)
