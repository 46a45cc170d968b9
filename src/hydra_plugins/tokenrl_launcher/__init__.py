"""tokenrl's Hydra plugins: every sweep job in a fresh process (`hydra/launcher: fresh_process`), the
`${tokenrl.run_id:}` resolver of run and sweep folders and `${tokenrl.run_record:...}`, where a run writes its record
(registered on import: Hydra's plugin scan imports this package before it composes a config)."""

from hydra_plugins.tokenrl_launcher import run_id, run_record
from hydra_plugins.tokenrl_launcher.fresh_process import FreshProcessLauncher

run_id.register()
run_record.register()

__all__ = ["FreshProcessLauncher"]
