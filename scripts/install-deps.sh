#!/usr/bin/env bash
# Install what netplugin needs on a Debian/Ubuntu machine (as root), then netplugin itself.
#   scripts/install-deps.sh            runtime: iproute2, flock, nftables, conntrack, python3-venv;
#                                      netplugin[daemon] in its own venv /opt/netplugin (PEP 668: Debian's python3 is left alone),
#                                      linked onto PATH (scripts/install.sh --venv-only)
#   scripts/install-deps.sh --test     the development path: pip install -e .[daemon,test,bench] into $PYTHON
#                                      (python3; a .venv beside it if that one is externally managed),
#                                      and the test tools (shellcheck, podman, mmdebstrap, ...)
# Idempotent: installs only what is missing.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: must run as root (it installs Debian packages)" >&2
    exit 2
fi

debs=(iproute2 util-linux procps python3 python3-venv)
# nftables: the `nft` command for the daemon's egress masquerade (netplugin/nodenet/egress.py)
debs+=(nftables)
# conntrack: the hostport members flush a UDP hostPort's stale conntrack entries with it
debs+=(conntrack)
# mmdebstrap: the image build (tests/deploy/test_image.py); systemd: systemd-analyze for the unit test
[ "$want_test" = 1 ] && debs+=(shellcheck iputils-ping mmdebstrap systemd)
# the containerd suite (tests/frontends/cni/test_containerd.py): a private containerd drives netplugin-cni
[ "$want_test" = 1 ] && debs+=(containerd runc busybox-static containernetworking-plugins)
# gcc, libc6-dev: the compiled CNI shim (install.sh builds it when a compiler is there) and its
# ASan/UBSan tests and fuzz run (tests/frontends/cni/test_native_shim*.py; gcc brings libasan, libubsan)
[ "$want_test" = 1 ] && debs+=(gcc libc6-dev)
missing=()
for pkg in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-deps: apt-get install ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "$want_test" = 0 ]; then
    exec bash "$here/scripts/install.sh" --venv-only
fi

# promtool checks the daemon's metrics (tests/frontends/daemon/test_service.py). Debian ships it in
# the prometheus package, whose server we do not want installed: take the one binary out of the .deb.
if ! command -v promtool >/dev/null; then
    deb_dir=$(mktemp -d)
    chmod 0755 "$deb_dir" # apt's download runs as _apt
    if (cd "$deb_dir" && apt-get download -qq prometheus 2>/dev/null) &&
        dpkg-deb --fsys-tarfile "$deb_dir"/prometheus_*.deb | tar -x -C "$deb_dir" ./usr/bin/promtool; then
        install -m 0755 "$deb_dir/usr/bin/promtool" /usr/local/bin/promtool
    else
        echo "install-deps: warning: could not get promtool from Debian's prometheus package" >&2
    fi
    rm -rf -- "$deb_dir"
fi

py=${PYTHON:-python3}
# PEP 668: an externally managed interpreter (Debian's own) gets a development venv instead.
if [ -z "${PYTHON:-}" ] && "$py" -c 'import os, sys, sysconfig
sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
    [ -x "$here/.venv/bin/python" ] || "$py" -m venv "$here/.venv"
    py=$here/.venv/bin/python
fi
"$py" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e "${here}[daemon,test,bench]"

if [ "$want_test" = 1 ]; then
    bash "$here/scripts/podman-setup.sh"
fi
