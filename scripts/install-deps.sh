#!/usr/bin/env bash
# Installs the Debian packages flashstep needs, only those missing. Uses sudo when not root.
# Where another apt-get holds the package manager's lock (as on a freshly booted cloud
# machine), it says so and waits for it, up to 10 minutes, instead of failing.
set -euo pipefail
packages=(
  build-essential cmake git
  libeigen3-dev doctest-dev libbenchmark-dev libcli11-dev
  python3 python3-dev python3-numpy python3-pytest pybind11-dev python3-venv
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
  lock_wait=600
  # The process holding dpkg's or apt's lock, if any ("unattended-upgr (pid 812)").
  lock_holder() {
    lslocks --noheadings --output COMMAND,PID,PATH 2>/dev/null |
      awk '$3 ~ /^\/var\/lib\/(dpkg\/lock|apt\/lists\/lock)/ {print $1 " (pid " $2 ")"; exit}'
  }
  wait_for_lock() {
    local holder waited=0
    while holder=$(lock_holder) && [ -n "$holder" ]; do
      if ((waited == 0)); then
        echo "flashstep: waiting for the package manager's lock, held by $holder (up to $((lock_wait / 60)) minutes)"
      fi
      if ((waited >= lock_wait)); then
        echo "flashstep: $holder still holds the lock after $((lock_wait / 60)) minutes; run this again when it is done" >&2
        exit 1
      fi
      sleep 5; waited=$((waited + 5))
    done
  }
  wait_for_lock
  $SUDO apt-get -o DPkg::Lock::Timeout=$lock_wait update -qq
  wait_for_lock
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=$lock_wait install -y -qq \
    --no-install-recommends "${missing[@]}"
else
  echo "flashstep: all Debian packages present"
fi
