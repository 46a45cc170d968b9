"""tokenrl's Hydra plugins: every sweep job in a fresh process (`hydra/launcher: fresh_process`), and the
`${tokenrl.run_id:}` resolver of run and sweep folders (registered on import: Hydra's plugin scan imports this package
before it composes a config)."""

from hydra_plugins.tokenrl_launcher.fresh_process import FreshProcessLauncher
from hydra_plugins.tokenrl_launcher.run_id import register

register()

__all__ = ["FreshProcessLauncher"]
