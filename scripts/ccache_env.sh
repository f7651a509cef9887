# shellcheck shell=bash
# Sourced by scripts/setup.sh and scripts/test.sh: ccache's settings for the builds that share
# objects (the extension's and build/cpp), the same in both or nothing is shared. Paths are taken
# relative to the checkout (the build directories are both two levels down), the working
# directory is not hashed, and depend mode spares a miss the preprocessor run. Returns 1 (and
# exports nothing) where ccache is not installed.
command -v ccache >/dev/null 2>&1 || return 1
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true CCACHE_DEPEND=true
