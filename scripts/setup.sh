#!/usr/bin/env bash
# Install the Debian packages strata builds with (skips apt when everything is present).
set -euo pipefail
PKGS=(cmake ninja-build g++ ccache pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev
      libgtest-dev libgmock-dev libopenmpi-dev openmpi-bin libpcre2-dev libopenblas-dev libboost1.81-dev
      libcurl4-openssl-dev libssl-dev
      clang-14 libclang-rt-14-dev libomp-14-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
