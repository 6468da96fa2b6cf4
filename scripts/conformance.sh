#!/usr/bin/env bash
# Kubernetes' own e2e suite (e2e.test) against netplugin, on a real 2-node cluster on this machine,
# with netplugin deployed the way a user deploys it. One command, as root:
#
#   scripts/conformance.sh [--report-dir DIR] [--focus REGEX]... [--skip REGEX]... [--small] [--list]
#
#   --report-dir DIR  where e2e.test writes junit_01.xml, and e2e.log and every component's log go
#                     (default ./conformance-report)
#   --focus REGEX     ginkgo focus (repeatable, OR-ed); default: the default set (docs/conformance.md)
#   --skip REGEX      ginkgo skip (repeatable, OR-ed); default: SCTP, [Disruptive], [Flaky], [Slow]
#   --small           focus on the four Pods granular checks and HostPort
#   --list            print the specs the focus selects, and run nothing
#   --disruption      then, on the same cluster, a rolling update of the DaemonSet and a node reboot
#                     under traffic between pods (requests lost, leaks)
#
# Steps: scripts/build-peers.sh (etcd, the Kubernetes commands, containerd 2, e2e.test, agnhost,
# kubectl, CoreDNS, from the Go module proxy; cached), scripts/build-image.sh (netplugin's image;
# cached), the test images (agnhost on Debian from the machine's apt sources, busybox and pause from
# busybox-static), then tests/conformance/run.py: the control plane and two nodes (each a network and
# a mount namespace with containerd, kubelet and kube-proxy), `kubectl apply -k` of etc/kubernetes,
# CoreDNS, e2e.test, the teardown. Prints "N passed, N failed, N skipped" last.
# Exit: 0 nothing failed but tests/conformance/expected-failures.yaml; 1 a spec failed; 2 usage or a
# missing prerequisite; 3 the cluster did not come up.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
report=./conformance-report
args=()
while [ $# -gt 0 ]; do
    case $1 in
    --report-dir | --focus | --skip | --timeout)
        [ $# -ge 2 ] || { echo "conformance.sh: $1 needs a value" >&2; exit 2; }
        if [ "$1" = --report-dir ]; then report=$2; else args+=("$1" "$2"); fi
        shift
        ;;
    --small | --list | --disruption) args+=("$1") ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
        exit 2
        ;;
    *) echo "conformance.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ "$(id -u)" = 0 ] || { echo "conformance.sh: run it as root (network and mount namespaces, containerd)" >&2; exit 2; }
for tool in ip nsenter unshare nft openssl podman mmdebstrap runc; do
    command -v "$tool" >/dev/null || { echo "conformance.sh: $tool is not installed (scripts/install-deps.sh --test)" >&2; exit 2; }
done
py=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ -x "$here/.venv/bin/python" ]; then py=$here/.venv/bin/python; fi

start=$SECONDS
echo "conformance.sh: building the peers (scripts/build-peers.sh; cached)" >&2
rc=0
peers=$(bash "$here/scripts/build-peers.sh") || rc=$?
[ "$rc" -eq 0 ] || { echo "conformance.sh: scripts/build-peers.sh failed (exit $rc)" >&2; exit 2; }
echo "conformance.sh: peers ready in $((SECONDS - start)) s: $peers" >&2
t=$SECONDS
read -r _ _ < <(bash "$here/scripts/build-image.sh") || { echo "conformance.sh: scripts/build-image.sh failed" >&2; exit 2; }
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$here/netplugin/__init__.py")
echo "conformance.sh: netplugin's image localhost/netplugin:$version ready in $((SECONDS - t)) s" >&2
cd "$here"
PYTHONPATH="$here:$here/tests${PYTHONPATH:+:$PYTHONPATH}" exec "$py" -m tests.conformance.run --peers "$peers" \
    --netplugin-image "localhost/netplugin:$version" --report-dir "$report" "${args[@]}"
