#!/usr/bin/env bash
# One command for a fresh machine (as root): install what the demo needs, then run `netplugin demo`.
# Arguments are passed to `netplugin demo` (for example --pods 5, or --native).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bash "$here/scripts/install-deps.sh"
# The netplugin that install-deps.sh put into its venv (the stock path), not whatever PATH finds first.
exec "${NETPLUGIN_PREFIX:-/opt/netplugin}/bin/netplugin" demo "$@"
