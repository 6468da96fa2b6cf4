#!/usr/bin/env bash
# Build the real Kubernetes peers the tests run against (containerd 2, critest/crictl, the CNI reference
# plugins, etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubelet, the
# NetworkPolicy agent kube-network-policies and its upstream manifest; Kubernetes' own e2e suite
# e2e.test with its agnhost, regression-issue-74839 (the Conntrack spec's server) and kubectl, and
# CoreDNS, for scripts/conformance.sh) from the Go module proxy, with the go.mod/go.sum pins under
# tests/peers/, and print the directory that holds them.
#   scripts/build-peers.sh            build what is missing, print DIR (the binaries are DIR/NAME)
# The proxy is the machine's own (`go env GOPROXY`), or NETPLUGIN_GOPROXY when set (a comma list).
# The cache lives outside the clone, keyed by the pins and the Go version:
#   ${NETPLUGIN_PEERS_CACHE:-/var/cache/netplugin-peers}/<key>/bin
# so a second run, or CI on the same machine, is a cache hit. Nothing is fetched except modules from
# the proxy, and only those go.sum names (-mod=readonly). A peer that fails to build (a module the
# proxy refuses, a compile error) is named on stderr with the error and its log; the others are
# still built; DIR/MISSING lists the failed ones (the tests needing them fail and say why).
# Exit: 0 all built; 3 some peers missing (DIR still printed); 2 usage or environment error.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
pins=$here/tests/peers
# group directory (under tests/peers) : Go package : binary path under DIR [: test, for a suite built with
# `go test -c`, as critest is; or: file : PATH, that file of the module, copied as is (a manifest)].
# The CNI plugins go to DIR/cni:
# their names (bridge, firewall) must not shadow commands when DIR is on a PATH.
peers=(
    "cni:github.com/containernetworking/plugins/plugins/main/bridge:cni/bridge"
    "cni:github.com/containernetworking/plugins/plugins/ipam/host-local:cni/host-local"
    "cni:github.com/containernetworking/plugins/plugins/main/loopback:cni/loopback"
    "cni:github.com/containernetworking/plugins/plugins/meta/portmap:cni/portmap"
    "cni:github.com/containernetworking/plugins/plugins/meta/bandwidth:cni/bandwidth"
    "cni:github.com/containernetworking/plugins/plugins/meta/firewall:cni/firewall"
    "critools:sigs.k8s.io/cri-tools/cmd/crictl:crictl"
    "critools:sigs.k8s.io/cri-tools/cmd/critest:critest:test"
    "containerd:github.com/containerd/containerd/v2/cmd/containerd:containerd"
    "containerd:github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2:containerd-shim-runc-v2"
    "containerd:github.com/containerd/containerd/v2/cmd/ctr:ctr"
    "kube:./etcd:etcd"
    "kube:k8s.io/kubernetes/cmd/kube-apiserver:kube-apiserver"
    "kube:k8s.io/kubernetes/cmd/kube-controller-manager:kube-controller-manager"
    "kube:k8s.io/kubernetes/cmd/kube-proxy:kube-proxy"
    "kube:k8s.io/kubernetes/cmd/kube-scheduler:kube-scheduler"
    "kube:k8s.io/kubernetes/cmd/kubelet:kubelet"
    "netpol:sigs.k8s.io/kube-network-policies/cmd:kube-network-policies"
    "netpol:sigs.k8s.io/kube-network-policies:kube-network-policies.yaml:file:install.yaml"
    "kube:k8s.io/kubernetes/cmd/kubectl:kubectl"
    "kube:k8s.io/kubernetes/test/images/agnhost:agnhost"
    "kube:k8s.io/kubernetes/test/images/regression-issue-74839:regression-issue-74839"
    "kube:k8s.io/kubernetes/test/e2e:e2e.test:test"
    "coredns:.:coredns"
)

if ! command -v go >/dev/null; then
    echo "build-peers: no go command on PATH (Go 1.26 is needed)" >&2
    exit 2
fi
export GOTOOLCHAIN=local
# The machine's own module proxies (`go env GOPROXY`: the GOPROXY variable, go's env file, or go's
# default), unless NETPLUGIN_GOPROXY overrides them. The proxies only: "direct" entries are dropped
# and "off" ends the list, so a module they lack is an error, never a direct VCS fetch.
proxies=${NETPLUGIN_GOPROXY:-$(go env GOPROXY)}
GOPROXY=
IFS=',|' read -r -a entries <<<"$proxies"
for entry in "${entries[@]}"; do
    case $entry in
    "" | direct | off) ;;
    *) GOPROXY+=$entry, ;;
    esac
done
if [ -z "$GOPROXY" ]; then
    echo "build-peers: the Go proxy setting ($proxies) names no module proxy: set GOPROXY (go env -w GOPROXY=URL) or NETPLUGIN_GOPROXY" >&2
    exit 2
fi
export GOPROXY=${GOPROXY}off
export GOFLAGS="-mod=readonly -buildvcs=false -trimpath"
export CGO_ENABLED=0
# Two cores are shared: at most two compile jobs.
jobs=${NETPLUGIN_PEERS_JOBS:-2}

key=$( {
    go version
    # relative names: a clone anywhere else (CI's) hashes to the same key
    cd "$pins" && find . -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) | LC_ALL=C sort | xargs sha256sum
} | sha256sum | cut -c1-16)
root=${NETPLUGIN_PEERS_CACHE:-/var/cache/netplugin-peers}/$key
bin=$root/bin
mkdir -p "$bin" "$root/log"
# One builder at a time per key; a second caller waits for the first and then finds a cache hit.
exec 9>"$root/lock"
flock 9

# A dependency's build is not stamped with its version: give the Kubernetes commands the pinned one,
# which `--version` and a kubelet's Node (status.nodeInfo.kubeletVersion) report.
ldflags_of() {
    local flags='-s -w' version minor
    if [ "$1" = kube ]; then
        version=$(cd "$pins/kube" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
        minor=${version#v1.}
        minor=${minor%%.*}
        flags+=" -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1"
        flags+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
    fi
    echo "$flags"
}

missing=()
for entry in "${peers[@]}"; do
    IFS=: read -r group pkg name kind file <<<"$entry"
    if [ "$kind" = file ]; then
        [ -f "$bin/$name" ] && continue
        # the module's own copy (its go.sum-checked zip in the module cache), not a fetched URL
        if dir=$(cd "$pins/$group" && go mod download "$pkg" && go list -m -f '{{.Dir}}' "$pkg") &&
            [ -f "$dir/$file" ] && install -m 0644 "$dir/$file" "$bin/$name.tmp" && mv -f "$bin/$name.tmp" "$bin/$name"; then
            echo "build-peers: copied $name ($pkg $file)" >&2
        else
            echo "build-peers: FAILED $name: no $file in module $pkg" >&2
            missing+=("$name")
        fi
        continue
    fi
    build=(build)
    [ "$kind" = test ] && build=(test -c)
    [ -x "$bin/$name" ] && continue
    log=$root/log/$name.log
    echo "build-peers: building $name ($pkg)" >&2
    start=$(date +%s)
    # Into a temporary name, renamed once complete: a killed build never leaves a half binary that looks cached.
    mkdir -p "$(dirname "$bin/$name")" "$(dirname "$log")"
    if (cd "$pins/$group" && go "${build[@]}" -p "$jobs" -ldflags="$(ldflags_of "$group")" -o "$bin/$name.tmp" "$pkg") >"$log" 2>&1; then
        mv -f "$bin/$name.tmp" "$bin/$name"
        echo "build-peers: built $name in $(($(date +%s) - start)) s" >&2
    else
        rm -f "$bin/$name.tmp"
        echo "build-peers: FAILED $name ($pkg); the go command said (full log $log):" >&2
        grep -E 'go: |proxy|refused|error|cannot|^[^ ].*\.go:[0-9]+' "$log" | head -n 8 | sed 's/^/    /' >&2 || tail -n 8 "$log" >&2
        missing+=("$name")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    printf '%s\n' "${missing[@]}" >"$bin/MISSING"
else
    rm -f "$bin/MISSING"
fi
echo "$bin"
[ "${#missing[@]}" -eq 0 ] || exit 3
