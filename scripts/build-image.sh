#!/usr/bin/env bash
# Build netplugin's DaemonSet image with podman from Debian's packages and this tree: no container
# registry is contacted, and the image build itself runs without network.
#
#   scripts/build-image.sh [--tag NAME] [--suite SUITE] [--mirror URL] [--rebuild]
#
#   --tag NAME     the image to build (default localhost/netplugin:VERSION)        [NETPLUGIN_IMAGE]
#   --suite SUITE  Debian suite of the base (default bookworm)
#   --mirror URL   Debian mirror for mmdebstrap (default: the machine's own, the apt source that
#                  serves SUITE, from `apt-get indextargets`)               [NETPLUGIN_DEBIAN_MIRROR]
#   --rebuild      build the base and the image again even when cached
#
# Steps, each cached by a hash of its inputs:
#   1. base: mmdebstrap a minimal Debian (python3, python3-venv, iproute2, util-linux, nftables, conntrack,
#      procps) into a tarball and `podman import` it as localhost/netplugin-base:<hash of the recipe>;
#      reused while that image exists (about 45 s to make, once per machine); the builder base
#      likewise (the same Debian with gcc and libc6-dev) as localhost/netplugin-builder:<hash>, for
#      the Containerfile's stage that compiles the C netplugin-cni (the final image has no compiler);
#   2. wheels: netplugin's wheel built from a copy of this tree (SOURCE_DATE_EPOCH fixed, so the same
#      tree gives the same bytes) and the wheels of its dependencies with the daemon extra, for
#      CPython 3.11 on manylinux x86_64 (pip download: PyPI or pip's cache);
#   3. image: `podman build --network=none --pull=never` of ./Containerfile on the bases, labelled
#      io.netplugin.inputs=<hash of bases, Containerfile and wheels>; an image of that tag with the
#      same label is reused as it is.
# Prints "IMAGE-ID DIGEST" on stdout (the digest pins the image in etc/kubernetes/kustomization.yaml);
# progress goes to stderr.
# Exit status: 0 built (or cached), 1 a step failed, 2 bad usage.
set -euo pipefail
umask 022

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
suite=bookworm
mirror=${NETPLUGIN_DEBIAN_MIRROR:-}
rebuild=0
tag=${NETPLUGIN_IMAGE:-}
python=${PYTHON:-python3}
# podman here runs as a root without CAP_SYS_RESOURCE: its default rlimits cannot be set.
ulimits=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
base_packages=python3,python3-venv,iproute2,util-linux,nftables,conntrack,procps,ca-certificates
# What compiling the C shim needs (netplugin's build runs on python3, which the base has).
builder_packages=$base_packages,gcc,libc6-dev

die() {
    echo "build-image.sh: $*" >&2
    exit "${2:-1}"
}
log() { echo "build-image.sh: $*" >&2; }

while [ $# -gt 0 ]; do
    case $1 in
    --tag | --suite | --mirror)
        [ $# -ge 2 ] || die "$1 needs a value" 2
        case $1 in
        --tag) tag=$2 ;;
        --suite) suite=$2 ;;
        --mirror) mirror=$2 ;;
        esac
        shift
        ;;
    --rebuild) rebuild=1 ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
        exit 2
        ;;
    *) die "unknown argument: $1 (see --help)" 2 ;;
    esac
    shift
done

command -v podman >/dev/null || die "podman is not installed (apt-get install podman)"
# The machine's own Debian mirror: the apt source whose suite is the base's (apt reads
# sources.list, sources.list.d/*.list and *.sources for us, and knows their syntax).
if [ -z "$mirror" ]; then
    command -v apt-get >/dev/null || die "no apt-get to read the machine's Debian mirror from: pass --mirror URL" 2
    mirror=$(apt-get indextargets --no-release-info --format '$(REPO_URI)' "Release: $suite" 'Identifier: Packages' 2>/dev/null | head -n 1)
    [ -n "$mirror" ] || die "apt's sources name no mirror for the suite $suite: pass --mirror URL (or set NETPLUGIN_DEBIAN_MIRROR)" 2
fi
mirror=${mirror%/}
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$here/netplugin/__init__.py")
[ -n "$version" ] || die "cannot read the version from $here/netplugin/__init__.py"
tag=${tag:-localhost/netplugin:$version}

work=$(mktemp -d)
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() { rm -rf -- "$work"; }
trap cleanup EXIT

label() { podman image inspect --format "{{index .Labels \"$2\"}}" "$1" 2>/dev/null || true; }

# --- 1. the bases -----------------------------------------------------------------------------------
# make_base NAME PACKAGES: localhost/NAME:<hash of its recipe>, made unless it exists; sets $made_key.
made_key=
make_base() {
    local name=$1 packages=$2 recipe key image start
    recipe="mmdebstrap --variant=minbase --include=$packages $suite $mirror"
    key=$(printf '%s\n' "$recipe" | sha256sum | cut -c1-16)
    image=localhost/$name:$key
    made_key=$key
    if [ "$rebuild" = 0 ] && podman image exists "$image"; then
        log "$name $image (cached)"
        return
    fi
    command -v mmdebstrap >/dev/null || die "mmdebstrap is not installed (apt-get install mmdebstrap)"
    log "$name: $recipe"
    start=$SECONDS
    # Docs, man pages and locales are dead weight in a container; apt's lists and caches too.
    # shellcheck disable=SC2016 # "$1" is mmdebstrap's, expanded by the hook's own shell
    mmdebstrap --quiet --mode=root --variant=minbase --include="$packages" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        "$suite" "$work/$name.tar" "$mirror" >&2 || die "mmdebstrap failed ($name)"
    podman import --quiet --message "$name: $recipe" \
        --change "LABEL io.netplugin.recipe=\"$recipe\"" --change 'CMD ["/bin/bash"]' \
        "$work/$name.tar" "$image" >/dev/null || die "podman import failed ($name)"
    rm -f -- "$work/$name.tar"
    log "$name $image made in $((SECONDS - start)) s"
}
make_base netplugin-base "$base_packages"
base_key=$made_key
base=localhost/netplugin-base:$base_key
make_base netplugin-builder "$builder_packages"
builder_key=$made_key
builder=localhost/netplugin-builder:$builder_key

# --- 2. the wheels ----------------------------------------------------------------------------------
ctx=$work/context
mkdir -p "$ctx/wheels" "$work/src"
for item in pyproject.toml README.md LICENSE netplugin exec_plugins etc scripts man; do
    cp -R -- "$here/$item" "$work/src/"
done
find "$work/src" -name __pycache__ -prune -exec rm -rf {} +
SOURCE_DATE_EPOCH=315532800 "$python" -m pip wheel --quiet --no-deps --disable-pip-version-check --no-input \
    --wheel-dir "$ctx/wheels" "$work/src" >&2 || die "building the netplugin wheel failed"
platforms=()
for p in manylinux_2_36 manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010; do
    platforms+=(--platform "${p}_x86_64")
done
"$python" -m pip download --quiet --disable-pip-version-check --no-input --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none "${platforms[@]}" --platform any \
    --dest "$ctx/wheels" --find-links "$ctx/wheels" "netplugin[daemon]==$version" >&2 ||
    die "downloading the wheels of netplugin's dependencies failed"
cp -- "$here/Containerfile" "$ctx/Containerfile"

# --- 3. the image -----------------------------------------------------------------------------------
inputs=$( (
    echo "$base_key $builder_key"
    sha256sum "$ctx/Containerfile" | cut -d' ' -f1
    cd "$ctx/wheels" && sha256sum -- * | sort -k2
) | sha256sum | cut -c1-32)
if [ "$rebuild" = 0 ] && [ "$(label "$tag" io.netplugin.inputs)" = "$inputs" ]; then
    log "image $tag (cached: inputs $inputs)"
else
    start=$SECONDS
    previous=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
    podman build --quiet --network=none --pull=never "${ulimits[@]}" \
        --build-arg "BASE=$base" --build-arg "BUILDER=$builder" --build-arg "VERSION=$version" \
        --label "io.netplugin.inputs=$inputs" --tag "$tag" --file "$ctx/Containerfile" "$ctx" >/dev/null ||
        die "podman build failed"
    log "image $tag built in $((SECONDS - start)) s"
    if [ -n "$previous" ] && [ "$previous" != "$(podman image inspect --format '{{.Id}}' "$tag")" ]; then
        # The image this tag named before: untagged now; removed unless something still uses it.
        podman rmi "$previous" >/dev/null 2>&1 || true
    fi
fi
podman image inspect --format '{{.Id}} {{.Digest}}' "$tag"
