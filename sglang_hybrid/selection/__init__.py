"""Price-based chain selection: each request verifies its model chain or its n-gram chain, one budget.

Inputs per request r: the model chain (tokens, prefix survivals a^M_{r,j}, j < G) and the n-gram chain
(tokens, survivals a^N_{r,j}, j < ngram_len[r] <= L). A survival is the estimated probability that the
draft token at position j and all before it are accepted. Survivals are clamped to [0, 1] (NaN and
negatives -> 0) and made non-increasing along each row by a running min. Lm = max(G, L). Verifying the
first l_r draft tokens of request r yields 1 + sum_{j<l_r} a_{r,j} tokens in expectation, so a batch
allocation yields tau = bs + S (S = admitted survivals) at verify batch B = bs + K tokens (K admitted).
Objective: budget mode maximises tau with K <= budget; SPS mode maximises Theta = tau * sps[B].

The rule (``select_chains_ref`` defines it, ``select_chains_triton`` reproduces it bit for bit, and
``tests/oracles/selection_oracle.py::rule_oracle`` re-implements it in plain Python):

a. Candidates: position j of a chain is a candidate iff a_j >= survival_eps (float32 compare),
   j < max_verify_len (0 = Lm) and j < the chain's length (G, or ngram_len[r] clamped to [0, L]).
b. Allocate(choice): over the candidates of the chains ``choice`` picks, budget mode K = min(budget,
   #candidates) (a negative budget counts as 0); SPS mode K = argmax over k in 0..#candidates of
   Theta_k = (bs + S_k) * sps[bs + k], S_k = the k largest survivals (first maximum wins, so k = 0
   wins ties). Admit the top K in the order (value desc, position asc, request asc), DSpark's order.
   Rows are non-increasing and ties go to the lower position, so each request's admitted tokens are a
   prefix: verify_len[r] = tokens admitted in row r.
c. Price. At price lam (fixed point, below), request r's surplus on chain d is
   sum over its candidates j of max(0, a^d_j - lam); it picks the n-gram chain iff that surplus is
   strictly larger than the model chain's (ties go to the model). Its demand is its number of
   candidates above lam on the picked chain. The price for a budget k, P(k), is the smallest lam in
   [0, 1] whose total demand fits in k: the Lagrange multiplier of the budget, found by a 24-step
   bisection over the 2**-24 grid.
d. Search, keeping the best allocation seen (largest objective; the first one on ties):
   starts: every request on the model chain (DSpark's allocation), each request on the chain with
   the larger total candidate survival (= surplus at price 0), the n-gram chain wherever it has a
   candidate. Budget mode: allocate each start; lam = P(budget); allocate the choices at lam and at
   lam - 2**-24 (the two sides of the multiplier's breakpoint). SPS mode: for each start, allocate,
   then num_iters times: lam = P(K) for the K just chosen; allocate the choices at lam and at
   lam - 2**-24; K = the better one's.
e. Outputs: the kept allocation's choice, verify_len, merged tokens and survivals (0 past the chosen
   chain's length), budget_used = its K, price = P(its K).

Why it is near-optimal, and where it is not. For fixed chains, admitting the top K is optimal (the
rows are non-increasing, so the top K are prefixes) and the SPS scan over k is exact. Choosing the
chains is a multiple-choice knapsack. Its Lagrangian relaxation prices a verified token at lam; each
request then maximises sum_j (a_j - lam) over its chains and prefixes independently, whose optimum is
exactly max(surplus_M, surplus_N): rule (c). Weak duality bounds the optimum, OPT(K) <= lam * K +
sum_r max_d surplus_d(lam) for every lam, and P(K) is where the demand crosses K, the minimiser of
this bound. The choices at P(K) and just below it bracket that crossing; the allocation loses
only the integrality gap: requests whose better chain at the price has more tokens above it than fit,
about one chain's worth of tokens in total. That vanishes relative to tau at large batches and
matters at bs = 1..6 with tight budgets. SPS mode adds a second difficulty: Theta is a product and
floor-probe SPS curves are step functions, so Theta over K is multi-modal and the Lagrangian price of
one K can miss a better regime at another K; the three starts (small K under the model chains,
large K at price 0, n-gram-heavy) and the iterations cover the regimes seen in testing. Keeping the
best allocation makes the result never worse than DSpark's own (the all-model allocation is always
evaluated).

Measured against brute force over all 2**bs choices (bs <= 6, ``tests/test_selection_oracle.py``,
which asserts >= 99% of instances within 1% of the optimum and none below 95%, and prints the
distribution): over 10,000 random instances per mode (random survivals, random budgets, random
roughly-decreasing SPS curves including coarse floor-probe steps), budget mode was exact on all of them,
SPS mode within 1% on 99.9% with a worst case of 0.984; at bs = 7..10 (150 instances) the worst SPS
case was 0.999. A first draft (price = the K-th admitted survival, an all-model start, the last iterate
returned) was within 1% on only about 90% of instances, with worst cases of 0.37 to 0.58: with that
price, tokens tied with the marginal one earn no surplus, a budget that is not binding still charges
a positive price, and the choices of all requests flip together from one iteration to the next.

Exact agreement between backends. Every sum is taken on integers: q = trunc(a * 2**24) (exact scaling,
then truncation), so S_k, the surpluses and the demands are int64 and independent of the summation
order; Theta_k = float64(bs * 2**24 + S_k) * float64(sps[bs + k]) is one IEEE multiply of exact
operands; the price is a fixed-point integer. Ordering uses the float32 survivals themselves (as
SGLang's DSpark scheduler does). The fixed point costs at most 2**-24 per token.

With no n-gram candidate anywhere every start is the all-model allocation, which is DSpark's:
verify_len + 1 equals SGLang's ``schedule_verify_lens_topk_from_survival`` for the same K, and the
SPS-mode K equals ``compute_verify_token_budget`` up to the fixed-point rounding above.

Cost: budget mode evaluates 5 allocations and 2 prices; SPS mode 3 * (1 + 2 * num_iters) allocations
and 3 * num_iters + 1 prices. The Triton kernel sorts the union of both chains' candidates once
(one int64 bitonic sort in one program); each allocation is then a few scans over it, each price 25
reductions over the [bs, Lm] tiles.
"""

from .api import BACKENDS, select_chains
from .buffers import (
    MAX_FLAT_ELEMENTS,
    QSCALE,
    QSCALE_LOG2,
    SelectionBuffers,
    SelectionOutput,
    SelectionWorkspace,
    flat_size,
    next_pow2,
)
from .reference import sanitize_survival, select_chains_ref
from .sps import SpsTable, dense_sps, load_sps_table, load_default_sps_table, roofline_sps_table
from .validate import SelectionArgumentError, validate_selection_args


def __getattr__(name: str):
    # The Triton kernel is imported on first use (triton is heavy, and the interpreter flag must be
    # set before triton is imported).
    if name == "select_chains_triton":
        from .triton_kernel import select_chains_triton

        return select_chains_triton
    raise AttributeError(name)


__all__ = [
    "BACKENDS",
    "MAX_FLAT_ELEMENTS",
    "QSCALE",
    "QSCALE_LOG2",
    "SelectionArgumentError",
    "SelectionBuffers",
    "SelectionOutput",
    "SelectionWorkspace",
    "SpsTable",
    "dense_sps",
    "flat_size",
    "load_default_sps_table",
    "load_sps_table",
    "next_pow2",
    "roofline_sps_table",
    "sanitize_survival",
    "select_chains",
    "select_chains_ref",
    "select_chains_triton",
    "validate_selection_args",
]
