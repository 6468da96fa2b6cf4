# shellcheck shell=bash disable=SC2154
# (SC2154: the options' variables are install.sh's)
# scripts/install.sh --uninstall: sourced by install.sh after it parsed and checked its options, so
# the same options name the same places. Removes what an install with them wrote (see --help).

uninstall_count=0

# uninstall_say TEXT: one thing removed (or, with --dry-run, that would be).
uninstall_say() {
    uninstall_count=$((uninstall_count + 1))
    if [ "$dry_run" = 1 ]; then echo "would remove $1"; else echo "removed $1"; fi
}

# uninstall_path PATH [what]: remove a file, link or tree that is there.
uninstall_path() {
    [ -e "$1" ] || [ -L "$1" ] || return 0
    uninstall_say "${2:-$1}"
    [ "$dry_run" = 1 ] || rm -rf -- "$1"
}

# uninstall_dir_if_empty DIR: a directory the install made, once nothing is left in it.
uninstall_dir_if_empty() {
    [ -d "$1" ] && [ -z "$(ls -A -- "$1")" ] || return 0
    uninstall_say "$1/"
    [ "$dry_run" = 1 ] || rmdir -- "$1"
}

# The interpreter that imports netplugin here: the venv's, the --lib-dir's, this tree's.
uninstall_tool=()
uninstall_find_tool() {
    local probe="import netplugin.frontends.uninstall"
    local entry="import sys; from netplugin.frontends.uninstall import main; sys.exit(main(sys.argv[1:]))"
    if [ -x "$prefix/bin/python" ] && "$prefix/bin/python" -B -I -c "$probe" 2>/dev/null; then
        uninstall_tool=("$prefix/bin/python" -B -I -c "$entry")
    elif [ -n "$lib_dir" ] && "$python" -B -I -S -c "import sys; sys.path[:0] = ['$lib_dir']; $probe" 2>/dev/null; then
        uninstall_tool=("$python" -B -I -S -c "import sys; sys.path[:0] = ['$lib_dir']; $entry")
    elif "$python" -B -I -c "import sys; sys.path[:0] = ['$here']; $probe" 2>/dev/null; then
        uninstall_tool=("$python" -B -I -c "import sys; sys.path[:0] = ['$here']; $entry")
    else
        return 1
    fi
}

uninstall_node() {
    local status=0 cmd plugin plugins_src module out rc pods_left=0
    # 1. the service, so that nothing makes pods or kernel objects while they are removed
    if [ "$systemd_dir" != none ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null &&
        systemctl is-active --quiet netplugin.service; then
        uninstall_say "the running service netplugin.service (systemctl stop, disable)"
        if [ "$dry_run" = 0 ]; then
            systemctl stop netplugin.service || status=1
            systemctl disable --quiet netplugin.service 2>/dev/null || true
        fi
    fi
    # 2. a daemon not under systemd, pods (--purge), kernel objects: netplugin's own code does it
    # (the daemon at the socket the config names, and at the run dir's)
    if uninstall_find_tool; then
        local args=(--config "$config" --socket "$run_dir/netplugin.sock" --state-dir "$state_dir")
        [ "$purge" = 0 ] || args+=(--purge)
        [ "$dry_run" = 0 ] || args+=(--dry-run)
        rc=0
        out=$("${uninstall_tool[@]}" "${args[@]}") || rc=$?
        [ "$rc" = 0 ] || status=1
        # 3: --purge could not tear every recorded pod down: their records must stay
        [ "$rc" != 3 ] || pods_left=1
        if [ -n "$out" ]; then
            printf '%s\n' "$out"
            uninstall_count=$((uninstall_count + $(printf '%s\n' "$out" | wc -l)))
        fi
    else
        echo "install.sh: warning: no interpreter here imports netplugin: its kernel objects (nft table inet" \
            "netplugin, proto 78 routes) and a running daemon are left as they are" >&2
        status=1
        # no pod could be torn down
        if [ -n "$(ls -A -- "$state_dir/pods" 2>/dev/null)" ]; then pods_left=1; fi
    fi
    # 3. the files, in the reverse order of the install
    [ "$systemd_dir" = none ] || uninstall_path "$systemd_dir/netplugin.service"
    uninstall_path "$cni_conf_dir/10-netplugin.conflist"
    uninstall_path "$config"
    uninstall_dir_if_empty "$(dirname -- "$config")"
    uninstall_dir_if_empty "$cni_conf_dir"
    uninstall_path "$cni_bin_dir/netplugin-cni"
    uninstall_path "$cni_bin_dir/netplugin-cni-python"
    uninstall_dir_if_empty "$cni_bin_dir"
    if [ -n "$lib_dir" ]; then
        for module in netplugin click yaml _yaml psutil; do uninstall_path "$lib_dir/$module"; done
        uninstall_dir_if_empty "$lib_dir"
    fi
    # The plugins this netplugin ships (a plugin someone else installed in the exec dir stays).
    plugins_src=$source_dir/exec_plugins
    [ ! -d "$prefix/share/netplugin/exec_plugins" ] || plugins_src=$prefix/share/netplugin/exec_plugins
    for plugin in "$plugins_src"/*/; do
        [ -d "$plugin" ] || continue
        uninstall_path "$exec_dir/$(basename -- "$plugin")"
    done
    uninstall_dir_if_empty "$exec_dir"
    if [ "$use_venv" = 1 ]; then
        # The manual page link install made (only ours: it points into this venv)
        if [ "$man_dir" != none ] && [ -L "$man_dir/netplugin.1" ] &&
            [ "$(readlink -- "$man_dir/netplugin.1")" = "$prefix/share/man/man1/netplugin.1" ]; then
            uninstall_path "$man_dir/netplugin.1"
        fi
        for cmd in netplugin netplugin-cni; do
            if [ -L "$bin_dir/$cmd" ] && [ "$(readlink -- "$bin_dir/$cmd")" = "$prefix/bin/$cmd" ]; then
                uninstall_path "$bin_dir/$cmd"
            fi
        done
        # Only a venv this script made (its stamp is there).
        [ ! -f "$prefix/.netplugin-wheel.sha256" ] || uninstall_path "$prefix" "$prefix/ (the venv)"
    fi
    # 4. pod state and addresses, only when asked, and only once no recorded pod is left: the
    # records are all that can still free a pod's veths and addresses
    if [ "$purge" = 1 ] && [ "$pods_left" = 1 ] && { [ -e "$state_dir" ] || [ -e "$run_dir" ]; }; then
        echo "install.sh: kept $state_dir/ and $run_dir/: recorded pods could not be torn down (see above)" >&2
    elif [ "$purge" = 1 ]; then
        uninstall_path "$state_dir" "$state_dir/ (pod records, addresses)"
        uninstall_path "$run_dir" "$run_dir/"
    fi
    if [ "$uninstall_count" = 0 ]; then
        echo "install.sh: nothing to remove"
    elif [ "$dry_run" = 1 ]; then
        echo "install.sh: dry run, nothing removed"
    else
        echo "install.sh: uninstalled"
    fi
    return "$status"
}
