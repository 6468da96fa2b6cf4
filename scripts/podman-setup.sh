#!/usr/bin/env bash
# Prepare this machine to run containers through podman's CNI backend, for the
# netplugin CNI shim tests (tests/frontends/cni, marker "podman") and for trying the shim by hand.
#
# Idempotent. Steps:
#   1. apt-get install podman runc containernetworking-plugins busybox-static (only if missing);
#   2. make podman use the CNI backend: /etc/containers/containers.conf gets
#      [network] network_backend = "cni". The file is written when absent; when present and
#      lacking the setting, the setting is added to it; when present with a *different*
#      backend, the script stops and says so (pass --force to switch it; a backup is kept);
#   3. build the image localhost/netplugin-busybox (busybox-static and applet links, ~2 MB)
#      with `podman import` unless it exists;
#   4. with --smoke: prove the stack with the *stock* CNI bridge plugin: two containers on a
#      throw-away network in 10.201.0.0/16 ping each other; everything is removed afterwards.
#
# Facts this relies on (podman 4.3.1 / Debian 12, checked by hand):
#   * CNI configs: /etc/cni/net.d (network_config_dir; `podman --network-config-dir DIR` overrides);
#     plugin binaries: cni_plugin_dirs, default /usr/local/libexec/cni, /usr/libexec/cni,
#     /usr/local/lib/cni, /usr/lib/cni, /opt/cni/bin (Debian's plugins are in /usr/lib/cni).
#     CONTAINERS_CONF=FILE makes podman read only that containers.conf (tests use this for a
#     private cni_plugin_dirs and network_config_dir, so nothing under /etc is touched).
#   * podman's libcni accepts results up to cniVersion 1.0.0 ("unsupported CNI result version
#     1.1.0"), and never calls STATUS or GC (nor CHECK).
#   * busybox ping needs --cap-add NET_RAW (podman drops it by default).
#   * containers need --runtime runc and explicit ulimits on this kind of machine:
#       podman --runtime runc run --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 ...
#
# Usage: scripts/podman-setup.sh [--smoke] [--force]
set -euo pipefail

IMAGE=${NETPLUGIN_TEST_IMAGE:-localhost/netplugin-busybox}
CONF=/etc/containers/containers.conf
APPLETS="sh ash ip ping nc sleep ifconfig wget cat ls echo hostname route ps kill true false grep sed
awk head tail sort wc tr cut env id ln mkdir rm mv cp date printf test [ uname ping6 arp netstat"

smoke=0
force=0
for arg in "$@"; do
    case "$arg" in
        --smoke) smoke=1 ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "podman-setup: unknown argument $arg (try --help)" >&2; exit 2 ;;
    esac
done

say() { printf 'podman-setup: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (podman's CNI backend needs it)"

# --- 1. packages -----------------------------------------------------------------------------------
missing=()
for pkg in podman runc containernetworking-plugins busybox-static; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# --- 2. containers.conf: network_backend = "cni" ----------------------------------------------------
mkdir -p "$(dirname "$CONF")"
if [ ! -e "$CONF" ]; then
    printf '[network]\nnetwork_backend = "cni"\n' > "$CONF"
    say "wrote $CONF"
else
    # The current setting, if any (ignoring comments); TOML allows either quote style.
    current=$(sed -n 's/^[[:space:]]*network_backend[[:space:]]*=[[:space:]]*["'\'']\([^"'\'']*\)["'\''].*/\1/p' "$CONF" | tail -n1)
    if [ "$current" = cni ]; then
        :
    elif [ -n "$current" ]; then
        if [ "$force" = 1 ]; then
            cp -p "$CONF" "$CONF.netplugin-backup"
            sed -i 's/^\([[:space:]]*network_backend[[:space:]]*=\).*/\1 "cni"/' "$CONF"
            say "switched network_backend from \"$current\" to \"cni\" in $CONF (backup: $CONF.netplugin-backup)"
        else
            die "$CONF sets network_backend = \"$current\"; the shim needs \"cni\". Re-run with --force to switch it (a backup is kept)."
        fi
    elif grep -q '^[[:space:]]*\[network\][[:space:]]*$' "$CONF"; then
        cp -p "$CONF" "$CONF.netplugin-backup"
        sed -i '0,/^[[:space:]]*\[network\][[:space:]]*$/s//[network]\nnetwork_backend = "cni"/' "$CONF"
        say "added network_backend = \"cni\" to the [network] table of $CONF (backup: $CONF.netplugin-backup)"
    else
        cp -p "$CONF" "$CONF.netplugin-backup"
        printf '\n[network]\nnetwork_backend = "cni"\n' >> "$CONF"
        say "appended a [network] table with network_backend = \"cni\" to $CONF (backup: $CONF.netplugin-backup)"
    fi
fi
backend=$(podman info --format '{{.Host.NetworkBackend}}' 2>/dev/null || true)
[ "$backend" = cni ] || die "podman reports network backend '${backend:-?}', not 'cni' (is CONTAINERS_CONF set?)"

# --- 3. the busybox image ---------------------------------------------------------------------------
if ! podman image exists "$IMAGE"; then
    bb=$(command -v busybox || true)
    [ -n "$bb" ] || bb=/bin/busybox
    # A dynamically linked busybox would need a libc in the image; busybox-static's is static.
    if file -L "$bb" 2>/dev/null | grep -q 'dynamically linked'; then
        die "$bb is dynamically linked; install busybox-static"
    fi
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/root/bin" "$work/root/tmp" "$work/root/etc" "$work/root/proc" "$work/root/sys" "$work/root/dev"
    chmod 1777 "$work/root/tmp"
    cp "$bb" "$work/root/bin/busybox"
    for a in $APPLETS; do
        ln -sf busybox "$work/root/bin/$a"
    done
    printf 'root:x:0:0:root:/:/bin/sh\n' > "$work/root/etc/passwd"
    printf 'root:x:0:\n' > "$work/root/etc/group"
    tar -C "$work/root" -cf "$work/rootfs.tar" .
    podman import -q --change 'CMD ["/bin/sh"]' --change 'ENV PATH=/bin' "$work/rootfs.tar" "$IMAGE" >/dev/null
    say "built $IMAGE"
fi

# --- 4. optional smoke test with the stock bridge plugin ------------------------------------------
if [ "$smoke" = 1 ]; then
    plugin_dir=""
    for d in /usr/lib/cni /opt/cni/bin /usr/libexec/cni /usr/local/lib/cni; do
        [ -x "$d/bridge" ] && [ -x "$d/host-local" ] && { plugin_dir=$d; break; }
    done
    [ -n "$plugin_dir" ] || die "no CNI bridge/host-local plugins found"
    hex=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
    net="np$hex"
    octet=$(( 0x${hex:0:2} ))
    subnet="10.201.$octet.0/24"
    tmp=$(mktemp -d)
    cleanup() {
        podman rm -f -t0 "${net}a" "${net}b" >/dev/null 2>&1 || true
        ip link del "npbr$hex" 2>/dev/null || true
        rm -rf "$tmp" "${work:-}"
    }
    trap cleanup EXIT
    mkdir -p "$tmp/net.d"
    cat > "$tmp/containers.conf" <<EOF
[network]
network_backend = "cni"
network_config_dir = "$tmp/net.d"
cni_plugin_dirs = ["$plugin_dir"]
EOF
    cat > "$tmp/net.d/$net.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "$net", "plugins": [{"type": "bridge", "bridge": "npbr$hex",
 "isGateway": true, "ipMasq": false, "hairpinMode": true,
 "ipam": {"type": "host-local", "dataDir": "$tmp/ipam", "ranges": [[{"subnet": "$subnet"}]]}}]}
EOF
    export CONTAINERS_CONF="$tmp/containers.conf"
    run=(podman --runtime runc run -d --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --cap-add NET_RAW
         --network "$net")
    "${run[@]}" --name "${net}a" "$IMAGE" sleep 120 >/dev/null
    "${run[@]}" --name "${net}b" "$IMAGE" sleep 120 >/dev/null
    ip_b=$(podman exec "${net}b" ip -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)
    [ -n "$ip_b" ] || die "smoke: container b has no IPv4 address on eth0"
    podman exec "${net}a" ping -c 2 -W 2 "$ip_b" >/dev/null || die "smoke: a cannot ping b ($ip_b)"
    podman rm -f -t0 "${net}a" "${net}b" >/dev/null
    left=$(find "$tmp/ipam/$net" -name '10.*' 2>/dev/null | wc -l)
    [ "$left" = 0 ] || die "smoke: $left address(es) still allocated after the containers were removed"
    say "smoke test passed: stock bridge on $subnet, a pinged b at $ip_b, addresses released"
fi
say "ready: podman $(podman --version | awk '{print $3}'), backend cni, image $IMAGE"
