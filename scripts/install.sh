#!/usr/bin/env bash
# Put netplugin's exec plugins and its CNI shim onto a node. Run as root; the
# DaemonSet's initContainer (etc/kubernetes/daemonset.yaml) runs it on every node.
#
#   scripts/install.sh [--source DIR] [--exec-dir DIR] [--cni-bin-dir DIR] [--cni-conf-dir DIR]
#                      [--python PATH] [--lib-dir DIR] [--dry-run]
#
#   --source DIR        a netplugin source tree (default: the tree holding this script)   [NETPLUGIN_SOURCE]
#   --exec-dir DIR      where exec plugins go
#                       (default /usr/libexec/kubernetes/kubelet-plugins/net/exec)        [NETPLUGIN_PLUGIN_DIR]
#   --cni-bin-dir DIR   where the netplugin-cni wrapper goes (default /opt/cni/bin)        [NETPLUGIN_CNI_BIN_DIR]
#   --cni-conf-dir DIR  where etc/cni/10-netplugin.conflist goes, when the source has one
#                       (default /etc/cni/net.d)                                          [NETPLUGIN_CNI_CONF_DIR]
#   --python PATH       the interpreter the wrapper runs (default /usr/bin/python3)       [NETPLUGIN_PYTHON]
#   --lib-dir DIR       also copy the netplugin package to DIR and point the wrapper's
#                       PYTHONPATH there, for nodes where netplugin is not pip-installed  [NETPLUGIN_LIB_DIR]
#   --dry-run           print what would change and change nothing
#
# Every installed file and directory ends up root-owned and not group- or world-writable
# (executables and directories 0755, other files 0644): netplugin refuses plugins that
# anyone but root could have changed. Idempotent: files whose content, mode and owner are
# already right are left alone ("unchanged"), so a second run changes nothing.
# Exit status: 0 done, 1 an install step failed, 2 bad usage.
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source_dir=${NETPLUGIN_SOURCE:-$here}
exec_dir=${NETPLUGIN_PLUGIN_DIR:-/usr/libexec/kubernetes/kubelet-plugins/net/exec}
cni_bin_dir=${NETPLUGIN_CNI_BIN_DIR:-/opt/cni/bin}
cni_conf_dir=${NETPLUGIN_CNI_CONF_DIR:-/etc/cni/net.d}
python=${NETPLUGIN_PYTHON:-/usr/bin/python3}
lib_dir=${NETPLUGIN_LIB_DIR:-}
dry_run=0

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

die() {
    echo "install.sh: $*" >&2
    exit "${2:-1}"
}

while [ $# -gt 0 ]; do
    arg=$1
    value=
    case $arg in
    --*=*)
        value=${arg#*=}
        arg=${arg%%=*}
        ;;
    esac
    case $arg in
    --source | --exec-dir | --cni-bin-dir | --cni-conf-dir | --python | --lib-dir)
        if [ -z "$value" ]; then
            [ $# -ge 2 ] || die "$arg needs a value" 2
            value=$2
            shift
        fi
        case $arg in
        --source) source_dir=$value ;;
        --exec-dir) exec_dir=$value ;;
        --cni-bin-dir) cni_bin_dir=$value ;;
        --cni-conf-dir) cni_conf_dir=$value ;;
        --python) python=$value ;;
        --lib-dir) lib_dir=$value ;;
        esac
        ;;
    --dry-run) dry_run=1 ;;
    -h | --help) usage ;;
    *) die "unknown argument: $arg (see --help)" 2 ;;
    esac
    shift
done

[ -d "$source_dir/exec_plugins" ] || die "$source_dir is not a netplugin source tree (no exec_plugins/)" 2
for d in "$exec_dir" "$cni_bin_dir" "$cni_conf_dir"; do
    [ -n "$d" ] || die "directory options must not be empty" 2
done
# These two are written into the wrapper script: keep them to characters that need no quoting.
safe_path='^/[A-Za-z0-9._/+-]*$'
[[ $python =~ $safe_path ]] || die "--python must be an absolute path of [A-Za-z0-9._/+-] (got '$python')" 2
if [ -n "$lib_dir" ]; then
    [[ $lib_dir =~ $safe_path ]] || die "--lib-dir must be an absolute path of [A-Za-z0-9._/+-] (got '$lib_dir')" 2
    [ -d "$source_dir/netplugin" ] || die "--lib-dir needs the netplugin package in $source_dir/netplugin" 2
fi

euid=$(id -u)
if [ "$euid" -ne 0 ]; then
    echo "install.sh: warning: not root; files keep uid $euid and netplugin's permission check accepts" \
        "them only for that user" >&2
fi

changed=0
tmp_file=
cleanup() {
    if [ -n "$tmp_file" ]; then rm -f -- "$tmp_file"; fi
}
trap cleanup EXIT

say() {
    if [ "$dry_run" = 1 ]; then
        echo "would $*"
    else
        echo "$*"
    fi
}

# owner_ok PATH: root-owned, or (not running as root) owned by us.
owner_ok() {
    [ "$(stat -c %u -- "$1")" = "$euid" ] && { [ "$euid" -ne 0 ] || [ "$(stat -c %g -- "$1")" = 0 ]; }
}

# ensure_dir DIR OWN: create DIR (0755) if missing. With OWN=1 the directory is netplugin's:
# fix its owner and strip group/world write from it. Shared dirs (CNI's) are only created.
ensure_dir() {
    local dir=$1 own=$2 mode
    if [ ! -d "$dir" ]; then
        [ ! -e "$dir" ] || die "$dir exists and is not a directory"
        say "create $dir/ (0755)"
        changed=1
        if [ "$dry_run" = 0 ]; then
            mkdir -p -- "$dir" # parents get 0755 from the umask
            chmod 0755 -- "$dir"
            if [ "$euid" -eq 0 ]; then chown 0:0 -- "$dir"; fi
        fi
        return 0
    fi
    [ "$own" = 1 ] || return 0
    mode=$(stat -c %a -- "$dir")
    if (((8#$mode & 8#022) != 0)) || ! owner_ok "$dir"; then
        say "fix $dir/ (was mode $mode, uid $(stat -c %u -- "$dir"))"
        changed=1
        if [ "$dry_run" = 0 ]; then
            chmod go-w -- "$dir"
            if [ "$euid" -eq 0 ]; then chown 0:0 -- "$dir"; fi
        fi
    fi
}

# install_file SRC DEST MODE: copy unless DEST already has that content, mode and owner.
# The copy goes to a temp file beside DEST and is renamed over it: a runtime executing
# the old file meanwhile sees either version whole, and a busy executable does not make
# the write fail with "text file busy".
install_file() {
    local src=$1 dest=$2 mode=$3
    if [ -f "$dest" ] && [ ! -L "$dest" ] && cmp -s -- "$src" "$dest" &&
        [ "$(stat -c %a -- "$dest")" = "${mode#0}" ] && owner_ok "$dest"; then
        echo "unchanged $dest"
        return 0
    fi
    say "install $dest ($mode)"
    changed=1
    [ "$dry_run" = 0 ] || return 0
    tmp_file="$(dirname -- "$dest")/.$(basename -- "$dest").netplugin-tmp.$$"
    cp -- "$src" "$tmp_file"
    chmod "$mode" -- "$tmp_file"
    if [ "$euid" -eq 0 ]; then chown 0:0 -- "$tmp_file"; fi
    mv -f -T -- "$tmp_file" "$dest"
    tmp_file=
}

# copy_tree SRC DEST PATTERN: SRC's regular files (names matching PATTERN) into DEST;
# files executable in SRC become 0755, others 0644. Symlinks are refused: a link could
# point anywhere on the node, and netplugin trusts only what root owns.
copy_tree() {
    local src=$1 dest=$2 pattern=$3 path rel mode
    ensure_dir "$dest" 1
    while IFS= read -r -d '' path; do
        rel=${path#"$src"/}
        if [ -L "$path" ]; then
            die "refusing symlink $path"
        elif [ -d "$path" ]; then
            ensure_dir "$dest/$rel" 1
        elif [ -f "$path" ]; then
            # shellcheck disable=SC2053 # PATTERN is a glob on purpose
            [[ $(basename -- "$path") == $pattern ]] || continue
            mode=0644
            if [ -x "$path" ]; then mode=0755; fi
            install_file "$path" "$dest/$rel" "$mode"
        fi
    done < <(find "$src" -mindepth 1 \( -name __pycache__ -prune \) -o -print0 | sort -z)
}

# 1. Exec plugins: every directory of exec_plugins/ (files at its top, such as README.md, are docs).
ensure_dir "$exec_dir" 1
found=0
for plugin in "$source_dir"/exec_plugins/*/; do
    [ -d "$plugin" ] || continue
    plugin=${plugin%/}
    found=1
    copy_tree "$plugin" "$exec_dir/$(basename -- "$plugin")" '*'
done
[ "$found" = 1 ] || echo "install.sh: warning: no plugins in $source_dir/exec_plugins" >&2

# 2. The Python package, when the node has no pip-installed netplugin.
if [ -n "$lib_dir" ]; then
    ensure_dir "$lib_dir" 1
    copy_tree "$source_dir/netplugin" "$lib_dir/netplugin" '*.py'
fi

# 3. The CNI shim: a small wrapper, because runtimes exec CNI plugins by file name from
# the CNI bin dir and the shim itself is a Python entry point (netplugin.frontends.cni:main).
ensure_dir "$cni_bin_dir" 0
wrapper_src=$(mktemp)
tmp_file=$wrapper_src
{
    echo '#!/bin/sh'
    echo '# netplugin-cni: installed by netplugin scripts/install.sh. Container runtimes run it as a'
    echo '# CNI plugin; it starts the CNI shim, netplugin.frontends.cni:main. Reinstall rather than edit.'
    if [ -n "$lib_dir" ]; then
        echo "PYTHONPATH=$lib_dir"
        echo 'export PYTHONPATH'
    fi
    echo '# The runtime picks our working directory: never import from it.'
    echo 'PYTHONSAFEPATH=1'
    echo 'export PYTHONSAFEPATH'
    echo "exec $python -c 'import sys; from netplugin.frontends.cni import main; sys.exit(main())' \"\$@\""
} >"$wrapper_src"
install_file "$wrapper_src" "$cni_bin_dir/netplugin-cni" 0755
rm -f -- "$wrapper_src"
tmp_file=

# 4. The CNI network config, when this source tree ships one.
conflist="$source_dir/etc/cni/10-netplugin.conflist"
if [ -f "$conflist" ]; then
    ensure_dir "$cni_conf_dir" 0
    install_file "$conflist" "$cni_conf_dir/10-netplugin.conflist" 0644
else
    echo "skip CNI config: no etc/cni/10-netplugin.conflist in $source_dir"
fi

if [ "$changed" = 0 ]; then
    echo "install.sh: nothing to do"
elif [ "$dry_run" = 1 ]; then
    echo "install.sh: dry run, nothing changed"
else
    echo "install.sh: done"
fi
