"""Calibrated acceptance estimates for n-gram draft tokens.

``q = P(draft token j accepted | tokens 1..j-1 accepted)`` from the drafter's features (match length, position,
match count, in_prompt, optionally agreement with the model chain), fit once on text and shipped
(``data/calibration/default.json``); survival ``a_j = prod_{i<=j} q_i``.

* :class:`CalibrationTable` (``table.py``): the versioned JSON format, validation (``CalibrationError``),
  ``check_covers(ngram_cfg)``, ``load`` / ``load_default`` / ``save``, ``to_device``.
* :class:`DeviceCalibration` (``apply.py``): ``apply(draft, model_tokens, out_q, out_survival)`` on the device,
  a Triton kernel and its torch reference ``apply_calibration_ref``.
* ``fit.py`` (``fit_table``), ``samples.py`` (replays), ``sources.py`` (text / model), ``metrics.py``,
  ``plot.py``, ``ablation.py``, ``cli.py`` (``hybrid-spark calibrate``).
"""

from .apply import DeviceCalibration, apply_calibration_ref, apply_calibration_triton
from .fit import fit_table
from .samples import Samples, samples_from_docs, samples_via_history
from .table import (
    DEFAULT_TABLE_PATH,
    FEATURE_NAMES,
    SCHEMA_VERSION,
    CalibrationError,
    CalibrationTable,
    Feature,
    default_edges,
)

__all__ = [
    "CalibrationError",
    "CalibrationTable",
    "DeviceCalibration",
    "Feature",
    "Samples",
    "DEFAULT_TABLE_PATH",
    "FEATURE_NAMES",
    "SCHEMA_VERSION",
    "apply_calibration_ref",
    "apply_calibration_triton",
    "default_edges",
    "fit_table",
    "samples_from_docs",
    "samples_via_history",
]
