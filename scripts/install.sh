#!/usr/bin/env bash
# Install netplugin onto a node. Run as root. Two modes:
#
# Default: a whole node install that respects PEP 668 (Debian's python3 is never pip-installed into):
#   1. a venv at --prefix made by --python, with netplugin and its daemon extra, from --wheel FILE or
#      built from the netplugin source tree --source;
#   2. netplugin and netplugin-cni linked into --bin-dir;
#   3. the exec plugins into --exec-dir;
#   4. the CNI shim into --cni-bin-dir: a script that starts the venv's interpreter isolated (-I -S)
#      with the venv's site-packages as its only path;
#   5. the node's config file --config: the one place of the node's settings (plugin, its env,
#      the dirs), which the daemon, the shim and the CLI all read; then the CNI network config
#      into --cni-conf-dir, naming that file (configFile) and the run dir (runDir), nothing else;
#   6. the systemd unit into --systemd-dir, running the venv's `netplugin serve --config FILE`.
# --no-venv (the DaemonSet's init container, or a node whose netplugin is installed otherwise):
#   steps 3-5 only. The shim runs --python with netplugin and the modules it needs (click, PyYAML,
#   psutil) copied to --lib-dir, or without --lib-dir the netplugin that --python imports.
#
#   scripts/install.sh [--prefix DIR] [--python PATH] [--wheel FILE] [--source DIR] [--extras LIST]
#                      [--bin-dir DIR] [--man-dir DIR] [--systemd-dir DIR] [--no-venv | --venv-only] [--lib-dir DIR]
#                      [--exec-dir DIR] [--cni-bin-dir DIR] [--cni-conf-dir DIR]
#                      [--state-dir DIR] [--run-dir DIR] [--config FILE] [--plugin NAME]... [--plugins LIST]
#                      [--plugin-env KEY=VALUE]... [--config-from FILE] [--cni-log-file FILE]
#                      [--native-shim FILE] [--shim-fallback python|none] [--dry-run]
#
#   --prefix DIR        the venv (default /opt/netplugin)                              [NETPLUGIN_PREFIX]
#   --python PATH       the interpreter that makes the venv, or with --no-venv the one the shim
#                       runs (default /usr/bin/python3, Debian's; needs python3-venv)  [NETPLUGIN_PYTHON]
#   --wheel FILE        install this netplugin wheel (default: build one from --source) [NETPLUGIN_WHEEL]
#   --source DIR        a netplugin source tree or installed data dir (share/netplugin);
#                       default: the tree holding this script                         [NETPLUGIN_SOURCE]
#   --extras LIST       extras to install with netplugin (default daemon; '' for none) [NETPLUGIN_EXTRAS]
#   --bin-dir DIR       where netplugin and netplugin-cni are linked (default /usr/local/bin)
#   --man-dir DIR       where the manual page netplugin.1 is linked, 'none' to skip
#                       (default /usr/local/share/man/man1)
#   --systemd-dir DIR   where netplugin.service goes, 'none' to skip (default /etc/systemd/system)
#   --no-venv           skip steps 1, 2 and 6
#   --venv-only         only steps 1 and 2 (netplugin on PATH, nothing for a kubelet)
#   --lib-dir DIR       with --no-venv: copy netplugin and its modules to DIR for the shim [NETPLUGIN_LIB_DIR]
#   --exec-dir DIR      where exec plugins go
#                       (default /usr/libexec/kubernetes/kubelet-plugins/net/exec)   [NETPLUGIN_PLUGIN_DIR]
#   --cni-bin-dir DIR   where the netplugin-cni shim goes (default /opt/cni/bin)      [NETPLUGIN_CNI_BIN_DIR]
#   --cni-conf-dir DIR  where 10-netplugin.conflist goes (default /etc/cni/net.d)     [NETPLUGIN_CNI_CONF_DIR]
#   --state-dir DIR     netplugin's state dir, for the conflist and the unit
#                       (default /var/lib/netplugin)                                  [NETPLUGIN_STATE_DIR]
#   --run-dir DIR       netplugin's run dir, likewise (default /run/netplugin)        [NETPLUGIN_RUN_DIR]
#   --config FILE       the node's config file (default /etc/netplugin/netplugin.yaml). The
#                       installer sets its plugin_dir, state_dir and run_dir from the options
#                       above on every run, plugin and env when given (first run: the shipped
#                       example's), and leaves every other key alone; it prints each key it changes
#   --plugin NAME       a member of the chain, repeatable: the members in order (first run default:
#                       the shipped example's chain, bridge then hostport, so pods' hostPorts work)
#   --plugins LIST      the chain as a comma-separated list (with --plugin: appended in order), e.g.
#                       --plugins netplugin.io/bridge,netplugin.io/hostport. A bad name, an empty
#                       member or one named twice is a usage error (exit 2) and nothing is written
#   --plugin-env KEY=VALUE  the plugin's env, repeatable; given, it replaces the whole env map
#   --config-from FILE  copy FILE as the config instead (the DaemonSet's ConfigMap); its dirs must
#                       be the ones given; excludes --plugin, --plugins and --plugin-env
#   --cni-log-file FILE the conflist's logFile: the shim appends one JSON line per call
#   --native-shim FILE  a compiled netplugin-cni built elsewhere (the image's build stage), installed
#                       with this node's socket and fallback written in, instead of compiling one
#                       here (a node or an init container without a C compiler)  [NETPLUGIN_NATIVE_SHIM]
#   --shim-fallback python|none  what the compiled shim does when the daemon does not run a call:
#                       exec the Python shim (default; standalone nodes), or none: CNI error 11, so
#                       a node with its daemon up runs no Python per call (cluster mode)
#                                                                                  [NETPLUGIN_SHIM_FALLBACK]
#   --dry-run           print what would change and change nothing
#   --uninstall         remove what an install with the same options wrote, printing each thing: it
#                       stops the service (systemd, else the daemon answering on the socket the
#                       config names and on the run dir's), removes netplugin's kernel objects
#                       outside pods (the egress table, the proto 78 routes, ...), the unit, the
#                       conflist, the CNI shim, the config file, the exec plugins it ships, the
#                       links (the man page's too) and the venv (or --lib-dir's modules). Pods keep
#                       their network: their hostPort table stays, and their records and addresses
#                       (the state and run dirs) stay for a reinstall, unless --purge: then every
#                       recorded pod is torn down first, then the hostPort table and both dirs are
#                       removed; a pod that cannot be torn down (its teardown fails, the config
#                       does not load) keeps both dirs and the table, and the exit status is 1.
#                       A second run removes nothing. With --dry-run it prints what it would remove.
#
# pip reads its usual PIP_* variables (PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX) for offline nodes.
# Every installed file and directory ends up root-owned and not group- or world-writable
# (executables and directories 0755, other files 0644): netplugin refuses plugins that
# anyone but root could have changed. Idempotent: files whose content, mode and owner are
# already right are left alone ("unchanged"), and a venv that already holds the same wheel is
# kept, so a second run changes nothing.
# Exit status: 0 done, 1 an install (or uninstall) step failed, 2 bad usage.
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
prefix=${NETPLUGIN_PREFIX:-/opt/netplugin}
python=${NETPLUGIN_PYTHON:-/usr/bin/python3}
wheel=${NETPLUGIN_WHEEL:-}
source_dir=${NETPLUGIN_SOURCE:-$here}
extras=${NETPLUGIN_EXTRAS-daemon}
bin_dir=/usr/local/bin
man_dir=/usr/local/share/man/man1
systemd_dir=/etc/systemd/system
exec_dir=${NETPLUGIN_PLUGIN_DIR:-/usr/libexec/kubernetes/kubelet-plugins/net/exec}
cni_bin_dir=${NETPLUGIN_CNI_BIN_DIR:-/opt/cni/bin}
cni_conf_dir=${NETPLUGIN_CNI_CONF_DIR:-/etc/cni/net.d}
state_dir=${NETPLUGIN_STATE_DIR:-/var/lib/netplugin}
run_dir=${NETPLUGIN_RUN_DIR:-/run/netplugin}
lib_dir=${NETPLUGIN_LIB_DIR:-}
config=/etc/netplugin/netplugin.yaml
config_from=
cni_log_file=
native_shim_from=${NETPLUGIN_NATIVE_SHIM:-}
shim_fallback_mode=${NETPLUGIN_SHIM_FALLBACK:-python}
plugin_names=()
plugin_name_given=0
plugin_env=()
plugin_env_given=0
use_venv=1
venv_only=0
dry_run=0
uninstall=0
purge=0

usage() {
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

die() {
    echo "install.sh: $1" >&2
    exit "${2:-1}"
}

while [ $# -gt 0 ]; do
    arg=$1
    value=
    has_value=0
    case $arg in
    --*=*)
        value=${arg#*=}
        arg=${arg%%=*}
        has_value=1
        ;;
    esac
    case $arg in
    --prefix | --python | --wheel | --source | --extras | --bin-dir | --man-dir | --systemd-dir | --lib-dir | \
        --exec-dir | --cni-bin-dir | --cni-conf-dir | --state-dir | --run-dir | --config | --plugin | --plugins | \
        --plugin-env | --config-from | --cni-log-file | --native-shim | --shim-fallback)
        if [ "$has_value" = 0 ]; then
            [ $# -ge 2 ] || die "$arg needs a value" 2
            value=$2
            shift
        fi
        case $arg in
        --prefix) prefix=$value ;;
        --python) python=$value ;;
        --wheel) wheel=$value ;;
        --source) source_dir=$value ;;
        --extras) extras=$value ;;
        --bin-dir) bin_dir=$value ;;
        --man-dir) man_dir=$value ;;
        --systemd-dir) systemd_dir=$value ;;
        --lib-dir) lib_dir=$value ;;
        --exec-dir) exec_dir=$value ;;
        --cni-bin-dir) cni_bin_dir=$value ;;
        --cni-conf-dir) cni_conf_dir=$value ;;
        --state-dir) state_dir=$value ;;
        --run-dir) run_dir=$value ;;
        --config) config=$value ;;
        --config-from) config_from=$value ;;
        --cni-log-file) cni_log_file=$value ;;
        --native-shim) native_shim_from=$value ;;
        --shim-fallback) shim_fallback_mode=$value ;;
        --plugin)
            plugin_names+=("$value")
            plugin_name_given=1
            ;;
        --plugins)
            # "a,b" -> a b; an empty member ("a,,b", "a,", "") stays one, and is refused below
            IFS=, read -r -a listed <<<"$value,"
            plugin_names+=("${listed[@]}")
            plugin_name_given=1
            ;;
        --plugin-env)
            plugin_env+=("$value")
            plugin_env_given=1
            ;;
        esac
        ;;
    --no-venv) use_venv=0 ;;
    --venv-only) venv_only=1 ;;
    --dry-run) dry_run=1 ;;
    --uninstall) uninstall=1 ;;
    --purge) purge=1 ;;
    -h | --help) usage ;;
    *) die "unknown argument: $arg (see --help)" 2 ;;
    esac
    shift
done

# --- checks before anything changes ---------------------------------------------------------------

# These paths are written into generated scripts and configs: keep them to characters that need
# no quoting anywhere (shell, JSON, systemd).
safe_path='^/[A-Za-z0-9._/+~-]*$'
check_path() {
    [[ $2 =~ $safe_path ]] || die "$1 must be an absolute path of [A-Za-z0-9._/+~-] (got '$2')" 2
}
check_path --python "$python"
check_path --exec-dir "$exec_dir"
check_path --cni-bin-dir "$cni_bin_dir"
check_path --cni-conf-dir "$cni_conf_dir"
check_path --state-dir "$state_dir"
check_path --run-dir "$run_dir"
check_path --config "$config"
[ -z "$cni_log_file" ] || check_path --cni-log-file "$cni_log_file"
[ -z "$native_shim_from" ] || [ -f "$native_shim_from" ] || die "--native-shim $native_shim_from: no such file" 2
case $shim_fallback_mode in
python | none) ;;
*) die "--shim-fallback must be python or none (got '$shim_fallback_mode')" 2 ;;
esac
if [ -n "$config_from" ]; then
    [ -f "$config_from" ] || die "--config-from $config_from: no such file" 2
    if [ "$plugin_name_given" = 1 ] || [ "$plugin_env_given" = 1 ]; then
        die "--config-from excludes --plugin, --plugins and --plugin-env (the file says which plugins)" 2
    fi
fi
if [ "$plugin_name_given" = 1 ]; then
    seen=" "
    for name in "${plugin_names[@]}"; do
        [[ $name =~ ^[A-Za-z0-9][A-Za-z0-9._/~-]*$ ]] ||
            die "--plugin/--plugins: each member must be a plugin name (got '$name')" 2
        [[ $seen != *" $name "* ]] || die "--plugin/--plugins: $name is named twice in the chain" 2
        seen+="$name "
    done
fi
for pair in "${plugin_env[@]}"; do
    [[ $pair =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--plugin-env must be KEY=VALUE with KEY a variable name (got '$pair')" 2
done
[[ $extras =~ ^[A-Za-z0-9_,-]*$ ]] || die "--extras must be a comma-separated list of names (got '$extras')" 2
[ "$purge" = 0 ] || [ "$uninstall" = 1 ] || die "--purge is for --uninstall" 2
if [ "$uninstall" = 1 ]; then
    # shellcheck source=scripts/uninstall.bash disable=SC1091 # (checked on its own)
    . "$here/scripts/uninstall.bash"
    uninstall_node
    exit "$?"
fi
[ -d "$source_dir/exec_plugins" ] ||
    die "$source_dir is not a netplugin source tree or data dir (no exec_plugins/)" 2
if [ "$use_venv" = 1 ]; then
    [ -z "$lib_dir" ] || die "--lib-dir is for --no-venv installs (a venv has its own library)" 2
    check_path --prefix "$prefix"
    check_path --bin-dir "$bin_dir"
    [ "$systemd_dir" = none ] || check_path --systemd-dir "$systemd_dir"
    [ "$man_dir" = none ] || check_path --man-dir "$man_dir"
    if [ -n "$wheel" ]; then
        [ -f "$wheel" ] || die "--wheel $wheel: no such file" 2
        [[ $(basename -- "$wheel") == netplugin-*.whl ]] || die "--wheel $wheel is not a netplugin wheel" 2
    else
        if [ ! -f "$source_dir/pyproject.toml" ] || [ ! -d "$source_dir/netplugin" ]; then
            die "$source_dir has no pyproject.toml and netplugin/ to build from: pass --wheel FILE" 2
        fi
    fi
    [ -x "$python" ] || die "--python $python is not an executable (Debian: apt-get install python3)" 2
    if [ ! -x "$prefix/bin/python" ] && ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
        # Debian splits venv's pip bootstrap into python3-venv, which a stock install lacks.
        if [ "$dry_run" = 0 ] && [ "$(id -u)" -eq 0 ] && [ "$python" = /usr/bin/python3 ] &&
            command -v apt-get >/dev/null; then
            echo "apt-get install python3-venv"
            if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; }; then
                die "apt-get install python3-venv failed"
            fi
        else
            die "$python cannot make a venv: install python3-venv (apt-get install python3-venv)" 2
        fi
    fi
elif [ -n "$lib_dir" ]; then
    check_path --lib-dir "$lib_dir"
fi
[ "$use_venv" = 1 ] || [ "$venv_only" = 0 ] || die "--no-venv and --venv-only exclude each other" 2

euid=$(id -u)
if [ "$euid" -ne 0 ]; then
    echo "install.sh: warning: not root; files keep uid $euid and netplugin's permission check accepts" \
        "them only for that user" >&2
fi

# The node config tool's arguments (from $source_dir, which a venv install moves to what it installed).
config_args=()
make_config_args() {
    config_args=("$config" --plugin-dir "$exec_dir" --state-dir "$state_dir" --run-dir "$run_dir")
    if [ -n "$config_from" ]; then
        config_args+=(--from "$config_from")
    else
        [ ! -f "$source_dir/etc/netplugin.yaml" ] || config_args+=(--defaults "$source_dir/etc/netplugin.yaml")
        for name in "${plugin_names[@]}"; do config_args+=(--plugin "$name"); done
        for pair in "${plugin_env[@]}"; do config_args+=(--plugin-env "$pair"); done
    fi
    [ ! -d "$source_dir/exec_plugins" ] || config_args+=(--plugins-from "$source_dir/exec_plugins")
}

# netplugin's own code writes the config (it parses YAML and validates every key as the daemon
# will): run by an interpreter that imports netplugin and PyYAML, the shim's if it can (-B: no
# __pycache__ left in the dirs it imports from).
config_tool=()
find_config_tool() {
    local entry="import sys; from netplugin.frontends.nodeconfig import main; sys.exit(main(sys.argv[1:]))"
    local probe="import netplugin.frontends.nodeconfig, yaml"
    if [ -n "$shim_path" ] && [ -d "$shim_path" ] &&
        "$shim_python" -B -I -S -c "import sys; sys.path[:0] = ['$shim_path']; $probe" 2>/dev/null; then
        config_tool=("$shim_python" -B -I -S -c "import sys; sys.path[:0] = ['$shim_path']; $entry")
    elif [ -z "$shim_path" ] && "$shim_python" -B -I -c "$probe" 2>/dev/null; then
        config_tool=("$shim_python" -B -I -c "$entry")
    elif [ -d "$source_dir/netplugin" ] &&
        "$python" -B -I -c "import sys; sys.path[:0] = ['$source_dir']; $probe" 2>/dev/null; then
        config_tool=("$python" -B -I -c "import sys; sys.path[:0] = ['$source_dir']; $entry")
    elif [ -d "$here/netplugin" ] && "$python" -B -I -c "import sys; sys.path[:0] = ['$here']; $probe" 2>/dev/null; then
        config_tool=("$python" -B -I -c "import sys; sys.path[:0] = ['$here']; $entry")
    elif [ -n "${lib_python:-}" ] && "$lib_python" -B -I -c "$probe" 2>/dev/null; then
        config_tool=("$lib_python" -B -I -c "$entry")
    else
        return 1
    fi
}

# --- 0. the config this run would write, checked before anything is written or installed: every
# key as the daemon reads it, each plugin of the chain built in, shipped here or valid in --exec-dir.
# Without an interpreter that imports netplugin and yaml yet (a first venv install from a wheel), the
# same check runs in step 5, before the config is written.
if [ "$venv_only" = 0 ]; then
    shim_python=$python
    shim_path=
    if [ "$use_venv" = 1 ] && [ -x "$prefix/bin/python" ]; then
        shim_python=$prefix/bin/python3
        shim_path=$("$prefix/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    elif [ "$use_venv" = 0 ]; then
        shim_path=$lib_dir
    fi
    make_config_args
    if find_config_tool; then
        "${config_tool[@]}" "${config_args[@]}" --dry-run >/dev/null ||
            die "the config was refused (above): nothing written" "$?"
    fi
fi

changed=0
tmp_files=()
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    if [ "${#tmp_files[@]}" -gt 0 ]; then rm -rf -- "${tmp_files[@]}"; fi
}
trap cleanup EXIT

# make_tmp [-d]: a temp file (or dir) removed at exit; its path in $made.
made=
make_tmp() {
    made=$(mktemp "$@")
    tmp_files+=("$made")
}

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
    local src=$1 dest=$2 mode=$3 tmp
    if [ -f "$dest" ] && [ ! -L "$dest" ] && cmp -s -- "$src" "$dest" &&
        [ "$(stat -c %a -- "$dest")" = "${mode#0}" ] && owner_ok "$dest"; then
        echo "unchanged $dest"
        return 0
    fi
    say "install $dest ($mode)"
    changed=1
    [ "$dry_run" = 0 ] || return 0
    tmp="$(dirname -- "$dest")/.$(basename -- "$dest").netplugin-tmp.$$"
    tmp_files+=("$tmp")
    cp -- "$src" "$tmp"
    chmod "$mode" -- "$tmp"
    if [ "$euid" -eq 0 ]; then chown 0:0 -- "$tmp"; fi
    mv -f -T -- "$tmp" "$dest"
}

# install_link TARGET LINK: LINK -> TARGET, unless it already points there.
install_link() {
    local target=$1 link=$2
    if [ -L "$link" ] && [ "$(readlink -- "$link")" = "$target" ]; then
        echo "unchanged $link"
        return 0
    fi
    [ ! -e "$link" ] || [ -L "$link" ] || die "$link exists and is not a symlink: not replacing it"
    say "link $link -> $target"
    changed=1
    [ "$dry_run" = 0 ] || return 0
    ln -sfn -- "$target" "$link"
}

# copy_tree SRC DEST: SRC's regular files into DEST; files executable in SRC become 0755,
# others 0644. Symlinks are refused: a link could point anywhere on the node, and netplugin
# trusts only what root owns. __pycache__ is skipped.
copy_tree() {
    local src=$1 dest=$2 path rel mode
    ensure_dir "$dest" 1
    while IFS= read -r -d '' path; do
        rel=${path#"$src"/}
        if [ -L "$path" ]; then
            die "refusing symlink $path"
        elif [ -d "$path" ]; then
            ensure_dir "$dest/$rel" 1
        elif [ -f "$path" ]; then
            mode=0644
            if [ -x "$path" ]; then mode=0755; fi
            install_file "$path" "$dest/$rel" "$mode"
        fi
    done < <(find "$src" -mindepth 1 \( -name __pycache__ -prune \) -o -print0 | sort -z)
}

# --- 1. the venv ----------------------------------------------------------------------------------

# build_wheel: a wheel of $source_dir in a temp dir (path in $made). The tree is copied first,
# because setuptools writes build/ and *.egg-info into the tree it builds; SOURCE_DATE_EPOCH makes
# the wheel byte-identical for an unchanged tree, which is how a rerun knows there is nothing to do.
build_wheel() {
    local copy out item
    make_tmp -d
    copy=$made
    for item in pyproject.toml README.md LICENSE netplugin exec_plugins etc scripts man; do
        if [ -e "$source_dir/$item" ]; then cp -R -- "$source_dir/$item" "$copy/"; fi
    done
    find "$copy" -name __pycache__ -prune -exec rm -rf {} +
    make_tmp -d
    out=$made
    SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-315532800} "$prefix/bin/python" -m pip wheel --quiet --no-deps \
        --disable-pip-version-check --no-input --wheel-dir "$out" "$copy" >&2 ||
        die "building the netplugin wheel from $source_dir failed (see pip's output above)"
    made=$(find "$out" -name 'netplugin-*.whl' | head -n 1)
    [ -n "$made" ] || die "pip built no netplugin wheel from $source_dir"
}

install_venv() {
    local stamp_file=$prefix/.netplugin-wheel.sha256 want spec
    if [ ! -x "$prefix/bin/python" ]; then
        [ ! -e "$prefix" ] || [ -d "$prefix" ] || die "$prefix exists and is not a directory"
        say "create venv $prefix ($python)"
        changed=1
        if [ "$dry_run" = 1 ]; then
            say "install netplugin${extras:+[$extras]} into $prefix"
            return 0
        fi
        "$python" -m venv "$prefix" || die "$python -m venv $prefix failed"
    fi
    if [ -z "$wheel" ]; then
        if [ "$dry_run" = 1 ]; then
            say "build netplugin from $source_dir and install it into $prefix (if it changed)"
            return 0
        fi
        build_wheel
        wheel=$made
    fi
    want="$(sha256sum -- "$wheel" | cut -d' ' -f1) ${extras}"
    if [ -f "$stamp_file" ] && [ "$(cat -- "$stamp_file")" = "$want" ] &&
        "$prefix/bin/python" -c 'import netplugin' 2>/dev/null; then
        echo "unchanged $prefix (netplugin $(basename -- "$wheel"))"
        return 0
    fi
    say "install $(basename -- "$wheel")${extras:+ [$extras]} into $prefix"
    changed=1
    [ "$dry_run" = 0 ] || return 0
    spec=$wheel
    if [ -n "$extras" ]; then spec="${wheel}[${extras}]"; fi
    # --force-reinstall of netplugin alone: a rebuilt wheel keeps its version number.
    "$prefix/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        --force-reinstall --no-deps "$wheel" >&2 || die "pip install $wheel failed"
    "$prefix/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "$spec" >&2 ||
        die "pip install of netplugin's dependencies failed"
    printf '%s\n' "$want" >"$stamp_file"
}

if [ "$use_venv" = 1 ]; then
    install_venv
    # From here on the data (plugins, conflist, unit) comes from what the venv installed, so the
    # node gets exactly what the wheel ships.
    if [ -d "$prefix/share/netplugin/exec_plugins" ]; then
        source_dir=$prefix/share/netplugin
    fi

    # --- 2. console scripts on PATH -------------------------------------------------------------
    ensure_dir "$bin_dir" 0
    for cmd in netplugin netplugin-cni; do
        install_link "$prefix/bin/$cmd" "$bin_dir/$cmd"
    done
    # The manual page the wheel ships (<prefix>/share/man/man1), linked where man(1) looks.
    if [ "$man_dir" != none ] && { [ -f "$prefix/share/man/man1/netplugin.1" ] || [ "$dry_run" = 1 ]; }; then
        ensure_dir "$man_dir" 0
        install_link "$prefix/share/man/man1/netplugin.1" "$man_dir/netplugin.1"
    fi
fi

finish() {
    if [ "$changed" = 0 ]; then
        echo "install.sh: nothing to do"
    elif [ "$dry_run" = 1 ]; then
        echo "install.sh: dry run, nothing changed"
    else
        echo "install.sh: done"
    fi
    exit 0
}
[ "$venv_only" = 0 ] || finish

# --- 3. exec plugins: every directory of exec_plugins/ (files at its top, such as README.md, are docs)
ensure_dir "$exec_dir" 1
found=0
for plugin in "$source_dir"/exec_plugins/*/; do
    [ -d "$plugin" ] || continue
    plugin=${plugin%/}
    found=1
    copy_tree "$plugin" "$exec_dir/$(basename -- "$plugin")"
done
[ "$found" = 1 ] || echo "install.sh: warning: no plugins in $source_dir/exec_plugins" >&2

# --- the library the shim imports with --no-venv --lib-dir ---------------------------------------

# The modules netplugin-cni imports when it works alone; the daemon extra's are not needed there.
shim_modules=(netplugin click yaml _yaml psutil)
if [ "$use_venv" = 0 ] && [ -n "$lib_dir" ]; then
    ensure_dir "$lib_dir" 1
    # Each module comes from the interpreter that runs this script's netplugin (the image's venv),
    # or, in a checkout, netplugin itself from the tree.
    lib_python=${NETPLUGIN_LIB_PYTHON:-}
    if [ -z "$lib_python" ]; then
        if [ -x "$here/../../bin/python" ]; then lib_python=$here/../../bin/python; else lib_python=$python; fi
    fi
    for module in "${shim_modules[@]}"; do
        if [ "$module" = netplugin ] && [ -d "$source_dir/netplugin" ]; then
            location=$source_dir/netplugin
        else
            location=$("$lib_python" -I -c 'import importlib.util, os, sys
spec = importlib.util.find_spec(sys.argv[1])
if spec is not None and spec.submodule_search_locations:
    print(list(spec.submodule_search_locations)[0])
' "$module" 2>/dev/null || true)
        fi
        if [ -z "$location" ]; then
            [ "$module" != netplugin ] || die "$lib_python cannot import netplugin: nothing to copy to $lib_dir"
            echo "install.sh: warning: $lib_python has no module $module; the shim may need it" >&2
            continue
        fi
        copy_tree "$location" "$lib_dir/$module"
    done
fi

# --- 4. the CNI shim ------------------------------------------------------------------------------

# Runtimes exec CNI plugins by file name from the CNI bin dir, and the shim is a Python entry point
# (netplugin.frontends.cni:main): this script starts it. -I -S: no site hooks, no user site, no
# PYTHON* variables, nothing from the runtime's working directory; the one path is written here.
if [ "$use_venv" = 1 ]; then
    shim_python=$prefix/bin/python3
    if [ -x "$prefix/bin/python" ]; then
        shim_path=$("$prefix/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    else
        shim_path=$prefix/lib/python3/site-packages # dry run before the venv exists
    fi
else
    shim_python=$python
    shim_path=$lib_dir
fi
ensure_dir "$cni_bin_dir" 0
make_tmp
shim_src=$made
if [ "$use_venv" = 1 ] && [ -x "$prefix/bin/netplugin" ] &&
    "$prefix/bin/netplugin" install-shim --help >/dev/null 2>&1; then
    # This netplugin writes its own fast entry script (python -I -S, its path spelled out).
    "$prefix/bin/netplugin" install-shim --kind cni "$shim_src" >/dev/null ||
        die "netplugin install-shim failed"
else
    {
        echo '#!/bin/sh'
        echo '# netplugin-cni: installed by netplugin scripts/install.sh. Container runtimes run it as a'
        echo '# CNI plugin; it starts the CNI shim, netplugin.frontends.cni:main. Reinstall rather than edit.'
        entry="from netplugin.frontends.cni import main; sys.exit(main())"
        if [ -n "$shim_path" ]; then
            echo "exec $shim_python -I -S -c 'import sys; sys.path[:0] = [\"$shim_path\"]; $entry' \"\$@\""
        else
            # The interpreter's own site-packages hold netplugin: keep site, still isolated.
            echo "exec $shim_python -I -c 'import sys; $entry' \"\$@\""
        fi
    } >"$shim_src"
fi
# The compiled shim (C, libc only), compiled here when this node has a C compiler or taken from
# --native-shim: it is netplugin-cni, and the Python shim becomes netplugin-cni-python, which it
# execs when the daemon does not run a call (--shim-fallback none: CNI error 11 instead, a cluster
# node needing no Python per call).
make_tmp
native_shim=$made
shim_fallback=$cni_bin_dir/netplugin-cni-python
[ "$shim_fallback_mode" != none ] || shim_fallback=none
native_args=("$native_shim" --socket "$run_dir/netplugin.sock" --fallback "$shim_fallback")
[ -z "$native_shim_from" ] || native_args+=(--from "$native_shim_from")
# The netplugin being installed builds it (its C source and frame header): the one the shim
# imports from the venv or --lib-dir, else (the interpreter's own) the source tree's if there is one.
native_path=$shim_path
[ -n "$native_path" ] || [ ! -d "$source_dir/netplugin" ] || native_path=$source_dir
if [ "$dry_run" = 0 ] && "$shim_python" -I -B -c 'import sys; sys.path[:0] = [p for p in sys.argv[1:2] if p]; del sys.argv[1]
from netplugin.frontends.cni.native import main; sys.exit(main())' "$native_path" "${native_args[@]}" >/dev/null; then
    install_file "$shim_src" "$cni_bin_dir/netplugin-cni-python" 0755
    install_file "$native_shim" "$cni_bin_dir/netplugin-cni" 0755
elif [ "$dry_run" = 0 ] && [ -n "$native_shim_from" ]; then
    die "cannot install the compiled shim --native-shim $native_shim_from (above)"
else
    [ "$dry_run" = 1 ] || echo "install.sh: note: no compiled shim (no C compiler?): netplugin-cni is the Python shim" >&2
    install_file "$shim_src" "$cni_bin_dir/netplugin-cni" 0755
fi

# --- 5. the node's config file, then the CNI network config naming it ------------------------------

config_dir=$(dirname -- "$config")
ensure_dir "$config_dir" 1
make_config_args
[ "$dry_run" = 0 ] || config_args+=(--dry-run)
if find_config_tool; then
    config_out=$("${config_tool[@]}" "${config_args[@]}") || die "writing $config failed (see above)" "$?"
    printf '%s\n' "$config_out"
    case $config_out in unchanged*) ;; *) changed=1 ;; esac
elif [ "$dry_run" = 1 ]; then
    chain_text=$(IFS=,; echo "${plugin_names[*]}")
    say "write $config (plugin_dir, state_dir, run_dir${chain_text:+, plugins $chain_text})"
    changed=1
else
    die "no interpreter here imports netplugin and yaml to write $config"
fi

conflist="$source_dir/etc/cni/10-netplugin.conflist"
if [ -f "$conflist" ]; then
    ensure_dir "$cni_conf_dir" 0
    make_tmp
    conf_src=$made
    tool_python=$python
    if [ "$use_venv" = 1 ] && [ -x "$prefix/bin/python" ]; then tool_python=$prefix/bin/python; fi
    if ! command -v "$tool_python" >/dev/null 2>&1; then tool_python=python3; fi
    # The shipped conflist, naming this node's config file and run dir (where the shim finds the
    # daemon's socket): it carries no setting, the daemon and the shim take them all from that file.
    "$tool_python" -I -c 'import json, sys
src, out, config, run_dir, log_file = sys.argv[1:]
with open(src) as f:
    conf = json.load(f)
for plugin in conf.get("plugins", []):
    if plugin.get("type") == "netplugin-cni":
        plugin.update(configFile=config, runDir=run_dir)
        if log_file:
            plugin["logFile"] = log_file
with open(out, "w") as f:
    json.dump(conf, f, indent=2)
    f.write("\n")
' "$conflist" "$conf_src" "$config" "$run_dir" "$cni_log_file" || die "cannot rewrite $conflist"
    install_file "$conf_src" "$cni_conf_dir/10-netplugin.conflist" 0644
else
    echo "skip CNI config: no etc/cni/10-netplugin.conflist in $source_dir"
fi

# --- 6. the systemd unit --------------------------------------------------------------------------

unit="$source_dir/etc/systemd/netplugin.service"
if [ "$use_venv" = 1 ] && [ "$systemd_dir" != none ]; then
    [ -f "$unit" ] || die "no etc/systemd/netplugin.service in $source_dir"
    ensure_dir "$systemd_dir" 0
    make_tmp
    unit_src=$made
    # ExecStart= runs the venv's netplugin (not the PATH link, which another install may replace)
    # with the node's config file, the one the conflist names: no setting anywhere else.
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in
        ExecStart=*) echo "ExecStart=$prefix/bin/netplugin serve --config $config" ;;
        *) echo "$line" ;;
        esac
    done <"$unit" >"$unit_src"
    install_file "$unit_src" "$systemd_dir/netplugin.service" 0644
    if [ "$changed" = 1 ] && [ "$dry_run" = 0 ] && [ -d /run/systemd/system ]; then
        echo "then: systemctl daemon-reload && systemctl enable --now netplugin"
    fi
fi

finish
