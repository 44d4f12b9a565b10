#!/usr/bin/env bash
# install-deps.sh: installs the Debian packages dflash builds and tests with.
# Idempotent: does nothing when everything is present. Needs root (or sudo).
set -eu
pkgs=(build-essential pkg-config bc libuv1-dev libsystemd-dev libinih-dev libcjson-dev
      libsqlite3-dev libopenblas-dev sqlite3 systemd util-linux python3 procps clang libclang-rt-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0
echo "installing: ${missing[*]}"
SUDO=; [[ $(id -u) -ne 0 ]] && SUDO=sudo
# passed through sudo (which resets the environment): no debconf prompt hidden behind >/dev/null
# (another apt run holding the package lock, unattended upgrades say, is waited for, 10 min at most)
APT=($SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
"${APT[@]}" update -qq
"${APT[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
