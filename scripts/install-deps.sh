#!/usr/bin/env bash
# Installs the Debian packages flashstep needs, only those missing. Uses sudo when not root.
set -euo pipefail
packages=(
  build-essential cmake git
  libeigen3-dev doctest-dev libbenchmark-dev libcli11-dev
  python3 python3-dev python3-numpy python3-pytest pybind11-dev
  doxygen graphviz libjs-mathjax
  python3-matplotlib python3-nbclient python3-nbformat python3-ipykernel python3-nbconvert
  clang libclang-rt-14-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "flashstep: installing missing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "flashstep: all Debian packages present"
fi
