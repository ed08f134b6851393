"""Where the project's own files are: the repository root (a source checkout, installed editable)
and its Hydra configs. Relative paths in configs resolve from the root."""

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = PROJECT_ROOT / "conf"
