"""Token selectors: which response tokens receive the policy-gradient update (one module each)."""
from tokenrl.selectors.base import SELECTORS, Selection, SelectionBatch, TokenSelector
from tokenrl.selectors.entropy import Entropy20Selector
from tokenrl.selectors.ict import ICTComplementSelector, ICTSelector
from tokenrl.selectors.random_control import RandomSelector
from tokenrl.selectors.stapo import STAPOSelector
from tokenrl.selectors.uniform import UniformSelector

__all__ = ["SELECTORS", "Entropy20Selector", "ICTComplementSelector", "ICTSelector", "RandomSelector",
           "STAPOSelector", "Selection", "SelectionBatch", "TokenSelector", "UniformSelector"]
