#!/usr/bin/env bash
# Install what netplugin needs on a Debian/Ubuntu machine (as root), then netplugin itself.
#   scripts/install-deps.sh            runtime: iproute2, flock, python packages, netplugin
#   scripts/install-deps.sh --test     also the test tools (shellcheck, pytest, ruff, mypy, podman)
# Idempotent: installs only what is missing.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: must run as root (it installs Debian packages)" >&2
    exit 2
fi

debs=(iproute2 util-linux procps)
[ "$want_test" = 1 ] && debs+=(shellcheck iputils-ping)
# the containerd suite (tests/frontends/cni/test_containerd.py): a private containerd drives netplugin-cni
[ "$want_test" = 1 ] && debs+=(containerd runc busybox-static containernetworking-plugins)
missing=()
for pkg in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-deps: apt-get install ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

py=${PYTHON:-python3}
extras="daemon"
[ "$want_test" = 1 ] && extras="daemon,test"
"$py" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e "${here}[${extras}]"

if [ "$want_test" = 1 ]; then
    bash "$here/scripts/podman-setup.sh"
fi
