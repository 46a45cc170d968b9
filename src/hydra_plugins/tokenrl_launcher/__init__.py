"""tokenrl's Hydra plugins: every sweep job in a fresh process (`hydra/launcher: fresh_process`), the
`${tokenrl.run_id:}` resolver of run and sweep folders and `${tokenrl.run_record:...}`, where a run writes its record
(registered on import: Hydra's plugin scan imports this package before it composes a config)."""

from omegaconf import OmegaConf

from hydra_plugins.tokenrl_launcher import run_id, run_record
from hydra_plugins.tokenrl_launcher.fresh_process import FreshProcessLauncher

# replace: Hydra's plugin scan may execute this package twice
OmegaConf.register_new_resolver(run_id.RESOLVER, run_id.run_id, use_cache=True, replace=True)
OmegaConf.register_new_resolver(run_record.RESOLVER, run_record.run_record, replace=True)

__all__ = ["FreshProcessLauncher"]
