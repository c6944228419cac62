"""A clairvoyant policy for the simulator: upper bounds on what a better chain choice or better verify lengths
could add over DSpark, on the same workload and cost model. It reads the reference output, which no server
has; it is a yardstick for the hybrid, never a policy to serve.

Both bounds start from DSpark's own step (``DSparkPolicy``: SGLang's budget on lagged survivals and top-K
verify lengths) and change one thing:

* ``choice``: each request keeps DSpark's verify length, and takes whichever chain the reference accepts
  furthest within it: the model chain, the n-gram chain from the request's own history
  (``TokenHistory.lookup``, the hybrid's configuration) or, with ``corpus="shared"``, the cross-request
  corpus's chain (``NgramCorpus``, built and fed as the hybrid's). The verify batch can only shrink (an n-gram
  chain shorter than the length verifies only its own tokens). This bounds what choosing among the chains
  adds at DSpark's lengths.
* ``lengths``: the model chain, verified only as far as the reference accepts it (capped by DSpark's length):
  a perfect confidence. This bounds what better lengths add with the model chain alone.
* ``both``: the two together (the chosen chain, verified as far as it is accepted).
* ``estimate``: not DSpark's step but the hybrid's (``HybridPolicy``, the same options), with one thing known:
  every model-free candidate (the own-history n-gram, the corpus) is priced by its true outcome, survival 1 up
  to the tokens the reference accepts and 0 after. The model chain keeps its confidences. This bounds what a
  better estimate of the n-gram chains could add, with everything else the hybrid's.

``run_policy`` passes the reference continuation to a policy whose ``clairvoyant`` is True
(``StepInput.reference``).
"""

from __future__ import annotations

import numpy as np
import torch

from ..calibration.candidates import make_step_corpus
from ..ngram import NgramConfig, TokenHistory
from ..selection.sps import SpsTable
from .policies import DSparkPolicy, HybridPolicy, StepInput, StepOutput
from .simulator import accepted_len

__all__ = ["ORACLE_MODES", "EstimateOracle", "OraclePolicy"]

ORACLE_MODES = ("choice", "lengths", "both", "estimate")


class OraclePolicy(DSparkPolicy):
    """DSpark's step with a clairvoyant chain choice and/or verify length (see the module docstring)."""

    name = "oracle"
    clairvoyant = True

    def __init__(self, gamma: int, sps: SpsTable, mode: str, *, lag: int = 2, n_min: int = 2, n_max: int = 8,
                 max_draft: int = 16, window: int = 0, corpus: str = "off", corpus_entries: int = 1 << 21,
                 max_bs: int = 1) -> None:
        if mode not in ORACLE_MODES[:3]:
            raise ValueError(f"oracle mode of OraclePolicy: choose from {ORACLE_MODES[:3]} ('estimate' is "
                             f"EstimateOracle), got {mode!r}")
        super().__init__(gamma, sps, lag=lag)
        self.mode = mode
        self.cfg = NgramConfig(n_min=n_min, n_max=n_max, max_draft=max_draft, window=window)
        self.cfg.validate()
        # The corpus as the hybrid builds it (make_step_corpus; its candidate pricing is not needed here).
        self.corpus = make_step_corpus(corpus, corpus_entries, num_slots=max_bs, max_bs=max_bs, width=max_draft,
                                       device="cpu", backend="torch")[0] if mode != "lengths" else None
        self._history: TokenHistory | None = None

    def record(self, inp: StepInput, out: StepOutput, committed: torch.Tensor, counts: torch.Tensor) -> None:
        """After verify and the history append: the corpus learns every request's committed tokens (as the
        hybrid's does)."""
        if self.corpus is not None:
            self.corpus.insert(self._history, inp.slots, counts)

    def step(self, inp: StepInput, history: TokenHistory) -> StepOutput:
        if inp.reference is None:
            raise ValueError("OraclePolicy needs StepInput.reference (run_policy passes it to clairvoyant policies)")
        ref = inp.reference
        base = super().step(inp, history)
        vl = base.verify_len.numpy().astype(np.int64)
        bs, g = inp.model_tokens.shape
        width = max(g, self.cfg.max_draft)
        chain = np.zeros((bs, width), dtype=np.int64)
        chain[:, :g] = inp.model_tokens.numpy()
        length = vl.copy()
        got = accepted_len(chain, ref, length)
        ngram = np.zeros(bs, dtype=bool)
        if self.mode in ("choice", "both"):
            self._history = history
            drafts = [history.lookup(inp.slots, self.cfg)]
            if self.corpus is not None:
                drafts.append(self.corpus.lookup(history, inp.slots))
            for d in drafts:
                ntok = np.zeros((bs, width), dtype=np.int64)
                ntok[:, : d.tokens.shape[1]] = d.tokens.numpy()
                nlen = np.minimum(d.length.numpy().astype(np.int64), vl)
                ngot = accepted_len(ntok, ref, nlen)
                take = ngot > got
                chain = np.where(take[:, None], ntok, chain)
                length = np.where(take, nlen, length)
                got = np.where(take, ngot, got)
                ngram |= take
        if self.mode in ("lengths", "both"):
            length = np.minimum(got, length)
        lens = torch.from_numpy(length)
        return StepOutput(torch.from_numpy(chain.astype(np.int32)), lens, bs + int(length.sum()),
                          torch.from_numpy(ngram))


class EstimateOracle(HybridPolicy):
    """The hybrid's step with every model-free candidate priced by its true outcome (``estimate`` above)."""

    name = "oracle"
    clairvoyant = True

    def __init__(self, *args, **kwargs) -> None:
        # The model chain keeps its confidences (no agreement rules); only the n-gram candidates are known.
        super().__init__(*args, **{**kwargs, "model_agreement": False})

    def _reprice(self, inp: StepInput, draft, q: torch.Tensor, surv: torch.Tensor, source: int) -> None:
        if inp.reference is None:
            raise ValueError("EstimateOracle needs StepInput.reference (run_policy passes it to clairvoyant policies)")
        L = q.shape[1]
        got = accepted_len(draft.tokens.numpy().astype(np.int64), inp.reference,
                           draft.length.numpy().astype(np.int64))
        known = torch.from_numpy((np.arange(L)[None, :] < got[:, None]).astype(np.float32))
        q.copy_(known)
        surv.copy_(known)
