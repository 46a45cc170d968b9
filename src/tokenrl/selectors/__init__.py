"""Token selectors: which response tokens receive the policy-gradient update, with what weight, clip range, KL
weight or advantage (one module each)."""

from tokenrl.records.selection import Selection, SelectionBatch
from tokenrl.selectors.archer import ArcherSelector
from tokenrl.selectors.base import TokenSelector
from tokenrl.selectors.covariance import ClipCovSelector, KLCovSelector
from tokenrl.selectors.entropy import Entropy20Selector
from tokenrl.selectors.forks_oracle import ForksMatchedRandomSelector, ForksOracleSelector
from tokenrl.selectors.gtpo import GTPOSelector
from tokenrl.selectors.ict import ICTComplementSelector, ICTSelector
from tokenrl.selectors.random_control import RandomSelector
from tokenrl.selectors.stapo import STAPOSelector
from tokenrl.selectors.uniform import UniformSelector

__all__ = [
    "ArcherSelector",
    "ClipCovSelector",
    "Entropy20Selector",
    "ForksMatchedRandomSelector",
    "ForksOracleSelector",
    "GTPOSelector",
    "KLCovSelector",
    "ICTComplementSelector",
    "ICTSelector",
    "RandomSelector",
    "STAPOSelector",
    "Selection",
    "SelectionBatch",
    "TokenSelector",
    "UniformSelector",
    "reference_selectors",
]


def reference_selectors(with_js: bool) -> dict[str, TokenSelector]:
    """The selectors every run compares its own choice with, at their paper defaults with warm-up off (so the choice
    shows from the first step): ICT top-10% per response when JS is computed, 20-Entropy, STAPO. One list for both
    places that use it: `select/jaccard_<name>` (observe/diagnostics.py) and each sample's `would_select`
    (observe/samples.py)."""
    chosen: dict[str, TokenSelector] = {"entropy20": Entropy20Selector(), "stapo": STAPOSelector()}
    if with_js:
        chosen = {"ict": ICTSelector(warmup_steps=0), **chosen}
    return chosen
