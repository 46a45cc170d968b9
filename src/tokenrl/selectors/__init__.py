"""Token selectors: which response tokens receive the policy-gradient update."""
from tokenrl.selectors.base import SELECTORS, Selection, TokenSelector
from tokenrl.selectors.uniform import UniformSelector

__all__ = ["SELECTORS", "Selection", "TokenSelector", "UniformSelector"]
