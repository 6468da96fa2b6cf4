#!/usr/bin/env bash
# One command for a fresh machine (as root): install what the tests need, then run lint, types and tests.
# Extra arguments go to pytest (for example -k bridge, or -m 'not podman').
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
bash scripts/install-deps.sh --test
py=${PYTHON:-python3}
# install-deps.sh made a development venv when python3 is externally managed (PEP 668).
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then py=.venv/bin/python; fi

echo "== ruff" >&2
"$py" -m ruff check netplugin tests bench
echo "== mypy" >&2
"$py" -m mypy
echo "== shellcheck" >&2
mapfile -t shells < <(find exec_plugins scripts tests/testplugins -type f -perm -u+x ! -name '*.py')
shellcheck -S warning "${shells[@]}"
echo "== peers: containerd 2, critest, CNI plugins 1.10, etcd, kube-apiserver... from the Go module proxy (cached)" >&2
# A peer that cannot be built is named above; the tests that need it then fail under CI (tests/gopeers.py).
if ! NETPLUGIN_PEERS=$(bash scripts/build-peers.sh); then
    echo "test: not every peer was built (see above)" >&2
fi
export NETPLUGIN_PEERS
echo "== the guarantee suites again, the plugin as the first member of chains of 2 and 3" >&2
for n in 2 3; do
    NETPLUGIN_TEST_CHAIN=$n "$py" -m pytest -p no:cacheprovider -q tests/store/test_state.py tests/manager/test_gc.py
done
echo "== pytest" >&2
exec "$py" -m pytest -p no:cacheprovider -q -rs "$@"
