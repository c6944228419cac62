"""Per-request fairness weights for the batch-wide selection (options ``fairness``, ``fairness_scope``).

The SPS selection spends one verify budget on the batch's most likely tokens, which maximises the batch's tokens
per second. In traffic that mixes kinds that starves the requests whose tokens are least likely: a code edit's
n-gram copy (survivals near 1) outbids a chat request's model chain (0.5-0.8), and in the simulator chat requests
beside code edits ran at 0.63x DSpark's speed at batch 32 and about 0.5x at batch 128 (README, "Mixed traffic").

The yardstick is what DSpark alone would give the same request on the same steps. Each step, before the selection,
``plan`` runs the selection itself on the model chains alone, with no n-gram candidate, which is DSpark's own verify
planner (SGLang's ``compute_verify_token_budget`` and top-K ``schedule_verify_lens_topk``: ``K = argmax_k (bs +
S_k) * SPS(bs + k)`` over survivals of at least ``SURVIVAL_EPS``, the top ``K`` admitted in the order value desc,
position asc, request asc; ``dspark_plan_ref`` is that definition): request ``r``'s expected tokens ``e_r = 1 +
its admitted survivals`` in a step of ``1 / SPS(bs + K)`` seconds. After verify, ``update`` books the hybrid's
own: ``h_r = 1 + the survivals of the chain it verified`` in ``1 / SPS(bs + verified tokens)`` seconds. Over the
request's life so far its relative speed is

    x_r = (sum h_r / sum hybrid seconds) / (sum e_r / sum DSpark seconds),

both from the same estimates, so a drafter whose confidences run high or low biases every request alike. Each
request's survivals (both chains) are multiplied by

    w_r = (m / x_r) ** a,   m = the smallest x in the batch,

so a token is worth more to a request that is furthest behind DSpark's speed for it (``a = 0``: the batch total
alone). A request with no verify step yet takes the mean ``x`` of the batch's others (``w = 1`` when none has one).
``w <= 1``, since the selection clamps survivals to [0, 1]; the selection's root term stays one token per request.
The choice between a request's two chains is unchanged (both are scaled alike); only how much of the batch's
budget each request gets moves, and with it the budget itself (a smaller sum of weighted survivals pays for fewer
verify tokens, so the step gets shorter for everyone). Measuring against DSpark, not against tokens a step, is
what keeps a request that DSpark would already serve fast (a code edit) from being pushed below DSpark's speed.

**Scope.** ``scope="request"`` (above) evens out every request, so it also taxes one kind of traffic alone: code
edits that copy run ahead of DSpark and those that do not run behind, and evening them out cost code edits alone 4%
of their speed at batch 32 in the simulator. ``scope="tenant"`` measures each tenant instead (the requests of the
batch with the same tenant id, ``weights(slots, tenant)``): ``x`` of a request is its tenant's, ``(sum h / sum
hybrid seconds) / (sum e / sum DSpark seconds)`` over the tenant's requests in the batch that have a verify step
(a tenant with none takes the mean ``x`` of the batch's requests that have one), and the rest is as above. Requests
of one tenant get one weight, so traffic of one tenant runs exactly as with ``fairness`` 0, and an operator who
gives each traffic class its own tenant (option ``tenant_key``: SGLang's cache key or routing key) keeps chat at
DSpark's speed beside code edits without taxing either on its own.

Decode-step rules: every method writes only into buffers made at construction (``plan``'s selection too, on a GPU:
the Triton kernel needs no scratch memory), never reads the device on the host and never branches on device
data. ``dspark_plan_ref`` and ``fair_weights_ref`` are the plain definitions the tests
compare with.
"""

from __future__ import annotations

import torch

from ..config import FAIRNESS_SCOPES
from .api import select_chains
from .buffers import SelectionBuffers

__all__ = ["FAIRNESS_SCOPES", "FairWeights", "dspark_plan_ref", "fair_weights_ref"]

SURVIVAL_EPS = 1e-6  # DSpark's DSparkScheduleConfig.survival_eps: smaller survivals are never admitted


def dspark_plan_ref(model_surv: torch.Tensor, sps: torch.Tensor) -> tuple[int, list[float], float]:
    """DSpark's plan for model chains alone: ``(K, expected tokens per request, step seconds)``.

    ``model_surv [bs, gamma]``: prefix survivals; ``sps``: the dense steps-per-second table (``sps[B]``)."""
    bs, g = model_surv.shape
    cells = [(float(model_surv[r, j]), j, r) for j in range(g) for r in range(bs)]
    order = sorted((i for i in range(len(cells)) if cells[i][0] >= SURVIVAL_EPS),
                   key=lambda i: (-cells[i][0], i))  # value desc, then position, request
    best_k, best, s = 0, None, 0.0
    for k in range(len(order) + 1):
        if k:
            s += cells[order[k - 1]][0]
        theta = (bs + s) * float(sps[bs + k])
        if best is None or theta > best:
            best_k, best = k, theta
    expected = [1.0] * bs
    for i in order[:best_k]:
        expected[cells[i][2]] += cells[i][0]
    return best_k, expected, 1.0 / float(sps[bs + best_k])


def fair_weights_ref(hyb_tokens: list[float], hyb_seconds: list[float], ds_tokens: list[float],
                     ds_seconds: list[float], steps: list[int], alpha: float,
                     tenant: list[int] | None = None) -> list[float]:
    """Plain definition: the weights of one batch from each request's sums so far (see the module docstring);
    ``tenant``: each request's tenant id (scope "tenant"), or None (scope "request")."""
    if tenant is None:
        x = [(h / th) / (e / td) if n > 0 else None
             for h, th, e, td, n in zip(hyb_tokens, hyb_seconds, ds_tokens, ds_seconds, steps)]
    else:
        x = []
        for t in tenant:
            g = [i for i in range(len(steps)) if tenant[i] == t and steps[i] > 0]
            x.append((sum(hyb_tokens[i] for i in g) / sum(hyb_seconds[i] for i in g))
                     / (sum(ds_tokens[i] for i in g) / sum(ds_seconds[i] for i in g)) if g else None)
    known = [v for v in x if v is not None]
    if not known:
        return [1.0] * len(steps)
    fill = sum(known) / len(known)
    x = [fill if v is None else v for v in x]
    m = min(x)
    return [(m / v) ** alpha for v in x]


class FairWeights:
    """Per-slot records of the hybrid's and DSpark's expected speed, and the weights they give.

    Args:
        num_slots: request-pool slots (rows of the records).
        max_bs: largest batch of one call.
        gamma: the model chain's length (the columns DSpark's plan reads).
        width: the widest chain ``update`` is given (the selection's ``Lm``).
        alpha: the exponent ``a`` (> 0; the step builds no ``FairWeights`` for 0).
        sps: the dense steps-per-second table the selection prices with (``selection.dense_sps``).
        device: where the records live.
        backend: ``select_chains``'s backend for the plan ("auto": the Triton kernel on CUDA tensors).
        scope: "request" or "tenant" (``weights`` then takes each request's tenant id).
    """

    def __init__(self, num_slots: int, max_bs: int, gamma: int, width: int, alpha: float, sps: torch.Tensor,
                 device, backend: str = "auto", scope: str = "request") -> None:
        if not alpha > 0:
            raise ValueError(f"fairness: alpha must be > 0, got {alpha}")
        if scope not in FAIRNESS_SCOPES:
            raise ValueError(f"fairness_scope: must be one of {FAIRNESS_SCOPES}, got {scope!r}")
        self.scope = scope
        if sps.shape[0] < max_bs * (1 + max(gamma, width)) + 1:
            raise ValueError(f"fairness: the SPS table covers {sps.shape[0] - 1} batch tokens, the step needs "
                             f"{max_bs * (1 + max(gamma, width))}")
        self.alpha = float(alpha)
        self.gamma = int(gamma)
        self.width = int(width)
        self.sps = sps
        self.backend = backend
        f32 = dict(dtype=torch.float32, device=device)
        # Per slot: expected tokens and seconds, hybrid and DSpark, and verify steps.
        self.hyb_tokens = torch.zeros(num_slots, **f32)
        self.hyb_seconds = torch.zeros(num_slots, **f32)
        self.ds_tokens = torch.zeros(num_slots, **f32)
        self.ds_seconds = torch.zeros(num_slots, **f32)
        self.steps = torch.zeros(num_slots, **f32)
        self.w = torch.ones(max_bs, **f32)
        # plan(): the selection itself on the model chains alone (no n-gram candidate) is DSpark's planner.
        self._plan = SelectionBuffers(max_bs, self.gamma, device)
        self._plan_tok = torch.zeros(max_bs, self.gamma, dtype=torch.int32, device=device)  # tokens play no part
        self._no_tok = torch.zeros(max_bs, 1, dtype=torch.int32, device=device)
        self._no_surv = torch.zeros(max_bs, 1, **f32)
        self._no_len = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self._ed = torch.ones(max_bs, **f32)
        self._td = torch.ones(1, **f32)
        # _book(): expected tokens and seconds of a step.
        cols = max(self.gamma, self.width)
        self._cols = torch.arange(cols, dtype=torch.int32, device=device).view(1, -1)  # verify lengths are int32
        self._in = torch.zeros(max_bs * cols, dtype=torch.bool, device=device)
        self._hs = torch.zeros(max_bs * cols, **f32)
        self._h = torch.zeros(max_bs, **f32)
        self._wc = torch.zeros(max_bs, **f32)
        self._vsum = torch.zeros(1, dtype=torch.int32, device=device)
        self._th = torch.zeros(1, **f32)
        self._one = torch.ones(1, **f32)
        # weights()
        self._st = torch.zeros(max_bs, **f32)
        self._x = torch.zeros(max_bs, **f32)
        self._den = torch.zeros(max_bs, **f32)
        self._known = torch.zeros(max_bs, dtype=torch.bool, device=device)
        self._kf = torch.zeros(max_bs, **f32)
        self._n = torch.zeros(1, **f32)
        self._fill = torch.zeros(1, **f32)
        self._m = torch.zeros(1, **f32)
        self._zero = torch.zeros(1, **f32)
        if scope == "tenant":  # weights(): per request, the sums of its tenant's requests in the batch
            self._eq = torch.zeros(max_bs * max_bs, dtype=torch.bool, device=device)
            self._same = torch.zeros(max_bs * max_bs, **f32)
            self._v = torch.zeros(max_bs, 5, **f32)
            self._g = torch.zeros(max_bs, 5, **f32)

    def reset(self, slots: torch.Tensor) -> None:
        """A new request in ``slots`` (at prefill)."""
        s = slots.to(torch.int64)
        for t in (self.hyb_tokens, self.hyb_seconds, self.ds_tokens, self.ds_seconds, self.steps):
            t.index_fill_(0, s, 0.0)

    def _book(self, surv: torch.Tensor, verify_len: torch.Tensor, tokens: torch.Tensor, seconds: torch.Tensor,
              scale: torch.Tensor | None = None) -> None:
        """``tokens [bs] = 1 + sum(surv[:, :verify_len]) / scale``, ``seconds [1] = 1 / SPS(bs + sum verify_len)``."""
        bs, wd = surv.shape
        outside = self._in[: bs * wd].view(bs, wd)
        hs = self._hs[: bs * wd].view(bs, wd)
        torch.ge(self._cols[:, :wd], verify_len.view(-1, 1), out=outside)
        hs.copy_(surv).masked_fill_(outside, 0.0)
        torch.sum(hs, 1, out=tokens)
        if scale is not None:
            tokens.div_(scale)
        tokens.add_(self._one)  # the root token
        torch.sum(verify_len, 0, keepdim=True, dtype=torch.int32, out=self._vsum)
        torch.index_select(self.sps[bs:], 0, self._vsum, out=seconds)  # SPS(bs + verified draft tokens)
        seconds.reciprocal_()

    def plan(self, model_surv: torch.Tensor) -> None:
        """Before the selection: DSpark's plan for this step's model chains alone (``model_surv [bs, >= gamma]``,
        prefix survivals). Keeps each request's expected tokens and the step's seconds for ``update``."""
        bs, g = model_surv.shape[0], self.gamma
        out = self._plan.view(bs)
        select_chains(self._plan_tok[:bs], model_surv[:, :g], self._no_tok[:bs], self._no_surv[:bs],
                      self._no_len[:bs], None, self.sps, out, num_iters=0, survival_eps=SURVIVAL_EPS,
                      backend=self.backend)
        self._book(out.survival, out.verify_len, self._ed[:bs], self._td)

    def weights(self, slots: torch.Tensor, tenant: torch.Tensor | None = None) -> torch.Tensor:
        """``w [bs]`` for the requests in ``slots`` (a view of a preallocated buffer); ``tenant [bs]``: their
        tenant ids, needed with scope "tenant" (ignored with "request")."""
        bs = slots.shape[0]
        st, x, den, known, w = self._st[:bs], self._x[:bs], self._den[:bs], self._known[:bs], self.w[:bs]
        kf = self._kf[:bs]
        torch.index_select(self.steps, 0, slots, out=st)
        torch.gt(st, self._zero, out=known)
        kf.copy_(known)
        if self.scope == "tenant":
            if tenant is None:
                raise ValueError("FairWeights.weights: scope 'tenant' needs each request's tenant id")
            v, g = self._v[:bs], self._g[:bs]
            for col, rec in enumerate((self.hyb_tokens, self.hyb_seconds, self.ds_tokens, self.ds_seconds)):
                torch.index_select(rec, 0, slots, out=den)
                torch.mul(den, kf, out=v[:, col])
            v[:, 4].copy_(kf)
            eq = self._eq[: bs * bs].view(bs, bs)
            same = self._same[: bs * bs].view(bs, bs)
            torch.eq(tenant.view(-1, 1), tenant.view(1, -1), out=eq)
            same.copy_(eq)
            torch.mm(same, v, out=g)  # per request: its tenant's known requests' sums, and how many there are
            torch.gt(g[:, 4], self._zero, out=known)
            kf.copy_(known)
            torch.mul(g[:, 0], g[:, 3], out=x)
            torch.mul(g[:, 1], g[:, 2], out=den)
        else:
            torch.index_select(self.hyb_tokens, 0, slots, out=x)
            torch.index_select(self.ds_seconds, 0, slots, out=den)
            x.mul_(den)
            torch.index_select(self.hyb_seconds, 0, slots, out=den)
            torch.index_select(self.ds_tokens, 0, slots, out=self._wc[:bs])
            den.mul_(self._wc[:bs])
        den.clamp_(min=1e-30)
        x.div_(den)  # relative speed; 0 where unknown
        torch.sum(kf, 0, keepdim=True, out=self._n)
        torch.sum(x, 0, keepdim=True, out=self._fill)
        self._n.clamp_(min=1.0)
        self._fill.div_(self._n)
        # Unknown requests take the others' mean. With none known every x is 0 here, so after the clamp all are
        # equal and every weight is exactly 1.
        torch.where(known, x, self._fill, out=x)
        x.clamp_(min=1e-6)
        torch.amin(x, 0, keepdim=True, out=self._m)
        torch.div(self._m, x, out=w)
        w.pow_(self.alpha)
        return w

    def update(self, slots: torch.Tensor, chosen_surv: torch.Tensor, verify_len: torch.Tensor) -> None:
        """After verify: ``chosen_surv [bs, W]`` the survivals of each request's verified chain as the selection
        saw them (this step's weights applied), ``verify_len [bs]`` its draft tokens verified (<= W)."""
        bs = slots.shape[0]  # slots int32 or int64 as they come: index_add_ takes either (no per-step conversion)
        torch.clamp(self.w[:bs], min=1e-30, out=self._wc[:bs])
        self._book(chosen_surv, verify_len, self._h[:bs], self._th, scale=self._wc[:bs])  # the estimates, unweighted
        self.hyb_tokens.index_add_(0, slots, self._h[:bs])
        self.hyb_seconds.index_add_(0, slots, self._th.expand(bs))
        self.ds_tokens.index_add_(0, slots, self._ed[:bs])
        self.ds_seconds.index_add_(0, slots, self._td.expand(bs))
        self.steps.index_add_(0, slots, self._one.expand(bs))
