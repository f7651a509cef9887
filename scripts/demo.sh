#!/usr/bin/env bash
# The main job on its embedded default: set-up (scripts/setup.sh), then a short
# DDP training run of a tiny transformer LM on 2 local CPU workers over Gloo,
# with gradients all-reduced by dynamiq (mode dynamiq, 5 bits, ring).
# Extra arguments go to `python -m dynamiq.demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m dynamiq.demo "$@"
