#!/usr/bin/env bash
# Make a small Python 3.11 base image for the Troupe worker image without pulling anything from
# a container registry: debootstrap a minimal Debian bookworm from a Debian mirror (bookworm's
# python3 is 3.11), strip what a worker never reads, and `docker import` the root filesystem.
#
# For air-gapped sites and for CI, where `python:3.11-slim` cannot be pulled. Needs root,
# debootstrap and a reachable Debian mirror (a local mirror works: pass --mirror).
#
#   docker/make-base-image.sh [--tag troupe-base:bookworm-py311] [--mirror URL] [--force]
#
# Then: troupe image build --base-image troupe-base:bookworm-py311
set -euo pipefail

TAG=troupe-base:bookworm-py311
SUITE=bookworm
MIRROR=""
FORCE=0

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --tag) TAG="$2"; shift 2 ;;
        --mirror) MIRROR="$2"; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "make-base-image.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

log() { echo "make-base-image.sh: $*" >&2; }

# The first plain Debian archive (not the security one) this machine's apt is configured with,
# in either the deb822 (*.sources) or the one-line (sources.list) format.
detect_mirror() {
    local uri
    uri=$(grep -hsE '^[[:space:]]*URIs:' /etc/apt/sources.list.d/*.sources \
        | awk '{for (i = 2; i <= NF; i++) print $i}' \
        | grep -v -- '-security' | grep -E '/debian/?$' | head -n1 || true)
    if [ -z "$uri" ]; then
        uri=$(grep -hsE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
            | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) {print $i; break}}' \
            | grep -v -- '-security' | grep -E '/debian/?$' | head -n1 || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

if [ "$(id -u)" -ne 0 ]; then
    log "must run as root (debootstrap creates device nodes and chroots)"
    exit 1
fi
for tool in debootstrap docker; do
    if ! command -v "$tool" >/dev/null; then
        log "'$tool' is not installed: apt-get install -y debootstrap docker.io"
        exit 1
    fi
done
if [ "$FORCE" -eq 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
    log "$TAG already exists (pass --force to make it again)"
    exit 0
fi
MIRROR="${MIRROR:-$(detect_mirror)}"

WORKDIR=$(mktemp -d /var/tmp/troupe-base.XXXXXX)
ROOTFS="$WORKDIR/rootfs"
cleanup() { rm -rf "$WORKDIR"; }
trap cleanup EXIT

# python3-venv brings ensurepip, so the worker Dockerfile can make a venv with pip in it;
# nothing else is needed to install wheels offline. minbase keeps apt and dpkg, so users can
# still apt-get packages into derived images.
log "debootstrap $SUITE from $MIRROR"
debootstrap --variant=minbase --include=python3,python3-venv \
    "$SUITE" "$ROOTFS" "$MIRROR" >"$WORKDIR/debootstrap.log" 2>&1 || {
    tail -n 30 "$WORKDIR/debootstrap.log" >&2
    log "debootstrap failed (log above): is $MIRROR reachable? pass --mirror URL"
    exit 1
}

cat >"$ROOTFS/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
EOF

# As in Debian's own slim images: later apt-get installs in derived images skip docs and
# translations too, and apt keeps no package lists or downloaded archives around.
cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/01-troupe-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
cat >"$ROOTFS/etc/apt/apt.conf.d/01-troupe-slim" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
EOF

log "stripping docs, locales, caches"
find "$ROOTFS/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$ROOTFS"/usr/share/{man,info,locale,lintian}/* \
    "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* \
    "$ROOTFS"/var/cache/debconf/*-old "$ROOTFS"/var/lib/dpkg/*-old \
    "$ROOTFS"/var/log/* "$ROOTFS"/tmp/* "$ROOTFS"/root/.cache
find "$ROOTFS/usr/lib" -depth -name __pycache__ -type d -exec rm -rf {} +

log "importing as $TAG"
tar --numeric-owner -C "$ROOTFS" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    --message "Debian $SUITE minbase + python3 (made by docker/make-base-image.sh)" \
    - "$TAG" >/dev/null
docker image ls "$TAG" >&2
