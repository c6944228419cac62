"""Two-branch verify: a request may verify its model chain and its n-gram chain together, as a tree of two
branches sharing the root, and keep the longer accepted branch (a ragged verify: DSpark-style).

Value of a two-branch request. When the two chains' first tokens differ, at most one branch can be accepted
past the root (the target produces one token there), so ``P(accepted >= j) = P(model >= j) + P(n-gram >= j)``:
the expected tokens are ``1 + sum_j a^M_j + sum_j a^N_j`` over the verified prefixes, additive. Estimates can
overshoot that bound (``a^M_1 + a^N_1 > 1``); both branches' survivals are then scaled by
``1 / (a^M_1 + a^N_1)``. Chains whose first tokens agree are never verified together (a tree would merge their
common prefix and the two events are not disjoint): such a request keeps the one-chain choice.

Selection (``select_two_branch``), given the one-chain selection's result: every token of an eligible request's
two chains (scaled survivals) and every token of the others' chosen chains is a candidate; because each chain's
survivals are non-increasing, the top ``k`` candidates are prefixes per chain, and SPS mode picks
``k = argmax_k (bs + S_k) * sps[bs + k]`` as the one-chain rule does. The resulting allocation is scored with
the true values (a request that ends with one branch counts it unscaled) and kept only if its objective beats
the one-chain selection's. ``tests/oracles/two_branch_oracle.py`` enumerates every per-request option on small
batches and checks the result against the optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .reference import sanitize_survival


@dataclass
class TwoBranch:
    """Per request: draft tokens to verify on each chain (both > 0 only for a two-branch request)."""

    model_len: torch.Tensor  # [bs] int64
    ngram_len: torch.Tensor  # [bs] int64
    objective: torch.Tensor  # [1] float64: (bs + expected accepted drafts) * sps[bs + K]
    used: torch.Tensor  # [1] bool: the two-branch allocation beat the one-chain one


def _value(sm, sn, lm, ln, scale):
    """Expected accepted draft tokens of each request for prefix lengths ``lm`` / ``ln``."""
    j_m = torch.arange(sm.shape[1], device=sm.device).view(1, -1)
    j_n = torch.arange(sn.shape[1], device=sn.device).view(1, -1)
    vm = torch.where(j_m < lm.view(-1, 1), sm, 0).sum(1)
    vn = torch.where(j_n < ln.view(-1, 1), sn, 0).sum(1)
    both = (lm > 0) & (ln > 0)
    return torch.where(both, (vm + vn) * scale, vm + vn)


def select_two_branch(model_tokens: torch.Tensor, model_surv: torch.Tensor, ngram_tokens: torch.Tensor,
                      ngram_surv: torch.Tensor, ngram_len: torch.Tensor, choice: torch.Tensor,
                      verify_len: torch.Tensor, sps: torch.Tensor, *, max_verify_len: int = 0,
                      survival_eps: float = 1e-6) -> TwoBranch:
    """Decide per request: its one-chain selection (``choice``, ``verify_len``) or both chains (see above).

    ``sps``: dense float32 steps/sec by verify batch tokens, long enough for ``bs * (1 + G + L)``.
    """
    bs, G = model_surv.shape
    L = ngram_surv.shape[1]
    dev = model_surv.device
    mvl = max_verify_len or max(G, L)
    j_m = torch.arange(G, device=dev).view(1, -1)
    j_n = torch.arange(L, device=dev).view(1, -1)
    nlen = ngram_len.to(torch.int64).clamp(0, L).view(-1, 1)
    sm = sanitize_survival(model_surv.to(torch.float32)).to(torch.float64)
    sn = sanitize_survival(torch.where(j_n < nlen, ngram_surv.to(torch.float32), 0)).to(torch.float64)
    ok_m = (j_m < mvl) & (sm >= survival_eps)
    ok_n = (j_n < nlen) & (j_n < mvl) & (sn >= survival_eps)
    eligible = (nlen.view(-1) > 0) & (model_tokens[:, 0].to(torch.int64) != ngram_tokens[:, 0].to(torch.int64))
    first = sm[:, 0] + sn[:, 0]
    scale = torch.where(first > 1.0, 1.0 / first.clamp(min=1e-12), torch.ones_like(first))
    chose_n = choice.to(torch.bool)
    # Candidates: both chains of an eligible request (scaled), the chosen chain of the others.
    use_m = ok_m & (eligible | ~chose_n).view(-1, 1)
    use_n = ok_n & (eligible | chose_n).view(-1, 1)
    sc = torch.where(eligible, scale, torch.ones_like(scale)).view(-1, 1)
    vals = torch.cat([torch.where(use_m, sm * sc, -1.0), torch.where(use_n, sn * sc, -1.0)], dim=1)  # [bs, G+L]
    pos = torch.cat([j_m.expand(bs, G), j_n.expand(bs, L)], dim=1)
    chain = torch.cat([torch.zeros(bs, G, dtype=torch.bool, device=dev), torch.ones(bs, L, dtype=torch.bool,
                                                                                        device=dev)], dim=1)
    # Admission order: value desc, then position asc, then request (a stable sort of the position-major order).
    flat_v = vals.reshape(-1)
    flat_pos = pos.reshape(-1)
    flat_req = torch.arange(bs, device=dev).view(-1, 1).expand(bs, G + L).reshape(-1)
    flat_chain = chain.reshape(-1)
    key_order = torch.argsort(flat_pos * bs + flat_req, stable=True)
    order = key_order[torch.argsort(-flat_v[key_order], stable=True)]
    v_sorted = flat_v[order]
    valid = v_sorted >= 0
    cs = torch.cumsum(torch.where(valid, v_sorted, 0), 0)
    n = torch.arange(1, v_sorted.numel() + 1, device=dev)
    top = sps.shape[0] - 1
    theta = (bs + cs) * sps[(bs + n).clamp(max=top)].to(torch.float64)
    theta = torch.where(valid, theta, float("-inf"))
    theta0 = bs * sps[bs].to(torch.float64)
    best = torch.argmax(theta)
    k = torch.where(theta0 >= theta[best], 0, best + 1)
    admitted = torch.zeros_like(valid)
    admitted[order] = valid & (n <= k)
    adm = admitted.view(bs, G + L)
    lm = adm[:, :G].sum(1)
    ln = adm[:, G:].sum(1)
    value2 = _value(sm, sn, lm, ln, scale)
    K2 = (lm + ln).sum()
    obj2 = (bs + value2.sum()) * sps[(bs + K2).clamp(max=top)].to(torch.float64)
    vl = verify_len.to(torch.int64)
    lm1 = torch.where(chose_n, 0, vl)
    ln1 = torch.where(chose_n, vl, 0)
    value1 = _value(sm, sn, lm1, ln1, scale)
    obj1 = (bs + value1.sum()) * sps[(bs + vl.sum()).clamp(max=top)].to(torch.float64)
    used = obj2 > obj1
    return TwoBranch(torch.where(used, lm, lm1), torch.where(used, ln, ln1),
                     torch.where(used, obj2, obj1).view(1), used.view(1))
