#!/usr/bin/env bash
# One command for a fresh machine (as root): install what the tests need, then run lint, types and tests.
# Extra arguments go to pytest (for example -k bridge, or -m 'not podman').
#
# Two phases, so that a cold peer build (Go, tens of minutes) overlaps the work that needs no peer:
#   1. scripts/build-peers.sh starts in the background (its output goes to a log, shown when it ends);
#      meanwhile ruff, mypy, shellcheck, the chain guarantee runs and pytest --peers without (every
#      test not marked `peers`; tests/conftest.py marks them, NETPLUGIN_PEERS unset);
#   2. once the build is done: pytest --peers only, with NETPLUGIN_PEERS exported.
# When the build is already over by the time pytest would start (a warm cache), one pytest runs all.
# Every step runs even when an earlier one failed; the script fails if any did, and names them.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/install-deps.sh --test
py=${PYTHON:-python3}
# install-deps.sh made a development venv when python3 is externally managed (PEP 668).
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then py=.venv/bin/python; fi

work=$(mktemp -d)
build_pid=""
stop_build() {
    # the script ended early (a signal, or a failure outside the steps): no build left behind
    if [ -n "$build_pid" ] && kill -0 "$build_pid" 2>/dev/null; then kill -- "-$build_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap stop_build EXIT

echo "== peers: containerd 2, critest, CNI plugins 1.10, etcd, kube-apiserver... from the Go module proxy" \
    "(cached; built in the background, its output shown when it ends)" >&2
build_started=$SECONDS
# its own process group (setsid), so that stop_build ends go and its compilers with it
# shellcheck disable=SC2016 # expanded by the inner bash
setsid bash -c 'start=$SECONDS; rc=0; bash scripts/build-peers.sh || rc=$?
    echo "build-peers.sh: exit $rc after $((SECONDS - start)) s" >&2; exit "$rc"' >"$work/peers.dir" 2>"$work/peers.log" &
build_pid=$!

failed=()
# step NAME COMMAND...: run it, remember a failure, go on
step() {
    local name=$1 rc=0
    shift
    echo "== $name" >&2
    "$@" || rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "test: $name failed (exit $rc)" >&2
        failed+=("$name")
    fi
}
# pytest exits 5 when the selection is empty (e.g. arguments naming only tests of the other phase)
pytest_phase() {
    local rc=0
    "$@" || rc=$?
    [ "$rc" -eq 5 ] && rc=0
    return "$rc"
}
shellcheck_all() {
    local shells
    mapfile -t shells < <(find exec_plugins scripts tests/testplugins -type f -perm -u+x ! -name '*.py')
    shellcheck -S warning "${shells[@]}"
}
chain_runs() {
    local n
    for n in 2 3; do
        NETPLUGIN_TEST_CHAIN=$n "$py" -m pytest -p no:cacheprovider -q tests/store/test_state.py \
            tests/manager/test_gc.py || return
    done
}

finish_build() {
    local build_rc=0
    echo "== peers: waiting for the build" >&2
    wait "$build_pid" || build_rc=$?
    build_pid=""
    sed 's/^/  peers: /' "$work/peers.log" >&2
    echo "== peers: ready $((SECONDS - build_started)) s after the start (exit $build_rc)" >&2
    # A peer that cannot be built is named above; the tests that need it then fail under CI (tests/support/gopeers.py).
    if [ "$build_rc" -ne 0 ]; then echo "test: not every peer was built (see above)" >&2; fi
    NETPLUGIN_PEERS=$(cat "$work/peers.dir")
    export NETPLUGIN_PEERS
}

# phase 1 sees no peers, whatever the caller exported: a test needing one unmarked fails under CI
unset NETPLUGIN_PEERS
step ruff "$py" -m ruff check netplugin tests bench
step mypy "$py" -m mypy
step shellcheck shellcheck_all
step "the guarantee suites again, the plugin as the first member of chains of 2 and 3" chain_runs
if ! kill -0 "$build_pid" 2>/dev/null; then
    # the build is over already (a warm cache: a cache hit takes no time): one pytest run, as before
    finish_build
    step "pytest (NETPLUGIN_PEERS=$NETPLUGIN_PEERS)" "$py" -m pytest -p no:cacheprovider -q -rs "$@"
else
    step "pytest, the tests that need no peer" \
        pytest_phase "$py" -m pytest -p no:cacheprovider -q -rs --peers without "$@"
    finish_build
    step "pytest, the tests that need a peer (NETPLUGIN_PEERS=$NETPLUGIN_PEERS)" \
        pytest_phase "$py" -m pytest -p no:cacheprovider -q -rs --peers only "$@"
fi

if [ "${#failed[@]}" -gt 0 ]; then
    printf 'test: FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "test: all passed" >&2
