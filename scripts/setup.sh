#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian machine (and fast when already done):
#   system packages (GoogleTest, iproute2, ccache) -> .venv -> Python packages
#   (torch 2.14.1 from the local wheel, pybind11, scikit-build-core, cmake,
#   ninja, pytest, pytest-xdist, numpy, tqdm, matplotlib; lightning, accelerate and tensorboard at
#   the versions the integration tests ran with) -> build and install dynamiq
#   (editable, incremental build directory under build/).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*"; }

# ---- 1. system packages ------------------------------------------------------
apt_pkgs=()
[ -f /usr/include/gtest/gtest.h ] || apt_pkgs+=(libgtest-dev)
[ -f /usr/include/gmock/gmock.h ] || apt_pkgs+=(libgmock-dev)
command -v ip >/dev/null 2>&1 || apt_pkgs+=(iproute2)
command -v tc >/dev/null 2>&1 || apt_pkgs+=(iproute2)
command -v ccache >/dev/null 2>&1 || apt_pkgs+=(ccache)  # shares compiled objects between the builds (below)
if [ ${#apt_pkgs[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  log "installing Debian packages: ${apt_pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y --no-install-recommends "${apt_pkgs[@]}" >/tmp/dynamiq-apt.log 2>&1; then
    $SUDO apt-get update >>/tmp/dynamiq-apt.log 2>&1
    $SUDO apt-get install -y --no-install-recommends "${apt_pkgs[@]}" >>/tmp/dynamiq-apt.log 2>&1 \
      || { cat /tmp/dynamiq-apt.log; exit 1; }
  fi
fi

# ---- 2. virtual environment ---------------------------------------------------------
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi
if [ ! -x .venv/bin/python ]; then
  # A fresh set-up takes about 7 GB here (.venv 5.8 GB: torch 2.14.1 is a CUDA build; build/ about
  # 1 GB after every test stage): say so up front rather than with pip's "[Errno 28] No space
  # left on device" halfway through the install (how CI failed on 2026-11-26, its disk filled by
  # earlier clones).
  need_kb=$((8 * 1024 * 1024))
  free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
  if [ -n "$free_kb" ] && [ "$free_kb" -lt "$need_kb" ]; then
    echo "[setup] error: $((free_kb / 1024)) MiB free on $(df -P . | awk 'NR == 2 { print $6 }');" \
      "a fresh set-up needs about 8 GiB (.venv with torch's CUDA build, then build/)" >&2
    exit 1
  fi
  log "creating .venv with $PY"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python

# ---- 3. Python packages ---------------------------------------------------------------
# torch==2.14.1 is a wheel on this machine's disk (pip finds it through its
# configured find-links); nothing is downloaded.
if ! $VPY - <<'EOF' >/dev/null 2>&1
import importlib, sys
import torch
assert torch.__version__.split("+")[0] == "2.14.1", torch.__version__
for m in ("pybind11", "scikit_build_core", "cmake", "ninja", "pytest", "xdist", "numpy", "tqdm", "matplotlib"):
    importlib.import_module(m)
EOF
then
  log "installing Python packages into .venv"
  $VPY -m pip install --disable-pip-version-check -q "torch==2.14.1" pybind11 scikit-build-core cmake ninja \
    pytest "pytest-xdist==3.8.0" numpy tqdm matplotlib
fi

# Trainer integrations (tests/python/test_integrations.py, examples/, docs/integrations.md): the
# versions tested. They require torch>=2.x and leave the local torch 2.14.1 in place (pip's
# constraint file caps torch at the local wheel; the check below fails otherwise).
INTEGRATIONS=("lightning==2.6.6" "accelerate==1.15.0" "tensorboard==2.21.0")
if ! $VPY - "${INTEGRATIONS[@]}" <<'EOF' >/dev/null 2>&1
import sys
from importlib.metadata import version
assert version("torch").split("+")[0] == "2.14.1", version("torch")
for req in sys.argv[1:]:
    name, want = req.split("==")
    assert version(name) == want, (name, version(name), want)
EOF
then
  log "installing ${INTEGRATIONS[*]} into .venv"
  $VPY -m pip install --disable-pip-version-check -q "torch==2.14.1" "${INTEGRATIONS[@]}"
  $VPY -c 'import torch; v = torch.__version__.split("+")[0]; assert v == "2.14.1", f"an integration replaced torch 2.14.1 with {v}"'
fi

# ---- 4. build and install dynamiq ---------------------------------------------------------
# Rebuild only when a source file is newer than the last successful build.
stamp=build/.dynamiq-installed
if [ ! -f "$stamp" ] || [ -n "$(find csrc python tests/cpp/*_codec CMakeLists.txt pyproject.toml -newer "$stamp" -print -quit)" ] \
   || ! $VPY -c "import dynamiq" >/dev/null 2>&1; then
  log "building dynamiq (C++ extension against the installed torch)"
  # through ccache (scripts/ccache_env.sh): scripts/test.sh's C++ build (build/cpp) then takes the
  # library's objects, CUDA ones included, from this build (same flags; 144 of its 429 CPU s on
  # the 2-core AMD guest, 2026-11-26). CMake reads the launchers at a build directory's first
  # configure.
  # shellcheck source=scripts/ccache_env.sh
  if source scripts/ccache_env.sh; then
    export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  fi
  # DYNAMIQ_TEST_CODECS: the test-only codecs (tests/cpp/*_codec, mode "negate") in this development
  # install, for tests/python (a wheel built elsewhere leaves them out: CMakeLists.txt)
  PATH="$PWD/.venv/bin:$PATH" $VPY -m pip install --disable-pip-version-check -q --no-build-isolation -e . \
    --config-settings=cmake.define.DYNAMIQ_TEST_CODECS=ON \
    >/tmp/dynamiq-build.log 2>&1 || { tail -50 /tmp/dynamiq-build.log; exit 1; }
  mkdir -p build && touch "$stamp"
fi
log "ready: $($VPY -c 'import dynamiq, torch; print("dynamiq", dynamiq.__version__, "modes", dynamiq.available_modes(), "| torch", torch.__version__)')"
