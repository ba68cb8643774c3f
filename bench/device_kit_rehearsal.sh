#!/usr/bin/env bash
# A rehearsal of bench/device_kit.sh on a machine without a GPU: an air-gapped GPU
# node as the kit meets it, in a chroot. A minimal Debian 12 (debootstrap
# --variant=minbase) with only g++, cmake, make, python3 and python3-venv: none of
# Debian's -dev packages, no mpirun, no protoc. CUDA is this machine's toolkit
# (CUDA_HOME, bind-mounted read-only at /usr/local/cuda); torch is the CUDA wheel
# installed into a venv in the chroot from the wheelhouse (pip --no-index). Then,
# with no network (a new network namespace: loopback only), the source tree and
# the kit copied in: `bench/device_kit.sh build /kit`, a 2-rank mpirun of the
# binary, the closure check on it (`bench/device_kit.sh closure`), and `bench/gpu_acceptance.sh --skip-build --dry-run`, which must stop at
# "no GPU" with exit 3: the expected end on a machine without one.
#
#   bench/device_kit_rehearsal.sh [--root DIR] [--kit DIR] [--torch VERSION] [--target T]
#     --root DIR     the chroot [/var/tmp/kit-rehearsal/root]; made once (network:
#                    the Debian mirror of this machine's apt sources), then reused
#     --kit DIR      a packed kit [DIR/../kit, packed here first when empty]
#     --torch V      the torch wheel to install [2.14.1, the CUDA leg's pin]
#     --target T     build only target T (default: every target)
#     --configure-only  stop after configuring (seconds; to debug the kit's paths)
#
# Needs root (debootstrap, chroot, mounts), debootstrap (apt-get install debootstrap)
# and a wheelhouse with the CUDA torch wheel and its dependencies
# (${BATCHDIST_CACHE:-~/.cache/batchdist}/wheels: tests/cuda_leg.sh --venv fills it).
# Exit code: 0 when the rehearsal ended as expected, 1 otherwise.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
root=/var/tmp/kit-rehearsal/root
kit=""
torch=2.14.1
target=""
configure_only=0
while [ $# -gt 0 ]; do
  case $1 in
    --root) root=$2; shift 2 ;;
    --kit) kit=$2; shift 2 ;;
    --torch) torch=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --configure-only) configure_only=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_kit_rehearsal.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "rehearsal: $*" >&2; }
die() { echo "rehearsal: error: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot, mounts)"
root=$(mkdir -p "$root" && cd "$root" && pwd)
[ -n "$kit" ] || kit="$(dirname "$root")/kit"
wheels=${BATCHDIST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/batchdist}/wheels
cuda=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")
[ -x "$cuda/bin/nvcc" ] || die "no CUDA toolkit at $cuda (set CUDA_HOME)"
compgen -G "$wheels/torch-$torch-*.whl" >/dev/null || die "no torch-$torch wheel in $wheels (tests/cuda_leg.sh --venv)"
t0=$(date +%s)

# --- the node's image: minbase + the host compiler, CMake, make, Python -----------------
if [ ! -f "$root/.rehearsal-base" ]; then
  command -v debootstrap >/dev/null || die "apt-get install debootstrap"
  mirror=$(grep -h -m1 -E '^URIs: .*/debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' || true)
  [ -n "$mirror" ] || mirror=$(grep -h -m1 -E '^deb .*/debian/? bookworm' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  log "debootstrap --variant=minbase bookworm $root $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
    die "debootstrap failed ($root.debootstrap.log)"
  chroot "$root" apt-get install -y -q --no-install-recommends g++ cmake make python3 python3-venv \
    >"$root.apt.log" 2>&1 || die "apt-get install in the chroot failed ($root.apt.log)"
  chroot "$root" apt-get clean
  touch "$root/.rehearsal-base"
fi
# What the kit brings must not be there already.
# shellcheck disable=SC2016  # dpkg-query's format, not the shell's
present=$(chroot "$root" dpkg-query -W -f '${Package} ${Status}\n' 2>/dev/null |
  awk '$4 == "installed" {print $1}' | grep -x -E 'libopenmpi-dev|openmpi-bin|libyaml-cpp-dev|libboost1.74-dev|nlohmann-json3-dev|libjpeg62-turbo-dev|libpng-dev|libopencv-core-dev|libprotobuf-dev|protobuf-compiler|libgtest-dev|libgloo-dev|libtorch-dev' || true)
[ -z "$present" ] || die "the chroot has packages the kit should bring: $present"

# The kit's base list says what a node already has: say what this image lacks of it.
# shellcheck disable=SC2016
missing_base=$(bash "$here/device_kit.sh" base | while read -r p; do
  chroot "$root" dpkg-query -W -f '${Status}\n' "$p" 2>/dev/null | grep -q ' installed$' || echo "$p"; done | xargs)
[ -z "$missing_base" ] || log "note: the image lacks these of the kit's base list (not loaded by the binary unless the closure check says so): $missing_base"

# mounts in a private mount namespace (gone when it ends); no network inside.
in_chroot() {  # in_chroot NET(0/1) COMMAND: bash -c COMMAND in the chroot
  local net=$1; shift
  local ns=(-m)
  [ "$net" = 1 ] || ns+=(-n)
  # shellcheck disable=SC2016  # expanded by the inner bash
  unshare "${ns[@]}" bash -euo pipefail -c '
    root=$1 cuda=$2 wheels=$3; shift 3
    ip link set lo up 2>/dev/null || true
    mount --make-rprivate /
    mount -t proc proc "$root/proc"
    mount -t sysfs sysfs "$root/sys" 2>/dev/null || mount --rbind /sys "$root/sys"
    mount --bind /dev "$root/dev"
    mount -t tmpfs tmpfs "$root/dev/shm"
    mkdir -p "$root/usr/local/cuda" "$root/wheels" "$root/tmp"
    mount --bind "$cuda" "$root/usr/local/cuda" && mount -o remount,ro,bind "$root/usr/local/cuda"
    mount --bind "$wheels" "$root/wheels" && mount -o remount,ro,bind "$root/wheels"
    exec chroot "$root" env -i HOME=/root PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      CUDA_HOME=/usr/local/cuda LANG=C.UTF-8 bash -euo pipefail -c "$1"' _ "$root" "$cuda" "$wheels" "$@"
}

# --- torch: the CUDA wheel from the wheelhouse, offline ----------------------------------
if [ ! -f "$root/opt/venv/.torch-$torch" ]; then
  log "venv: torch==$torch from the wheelhouse (pip --no-index, no network)"
  t=$(date +%s)
  in_chroot 0 "rm -rf /opt/venv && python3 -m venv /opt/venv &&
    /opt/venv/bin/pip install -q --no-index --find-links /wheels torch==$torch &&
    touch /opt/venv/.torch-$torch" >"$root.venv.log" 2>&1 || die "venv failed ($root.venv.log)"
  log "venv: $(( $(date +%s) - t )) s"
fi

# --- the kit, packed here (network) ---------------------------------------------------------
if ! compgen -G "$kit/debs/*.deb" >/dev/null; then
  log "packing the kit into $kit"
  bash "$here/device_kit.sh" pack "$kit"
fi

# --- carried in: the source tree (tracked and untracked, not ignored) and the kit ----------
# A rerun keeps the chroot's build directory (src/build-cuda; the kit's build
# starts it afresh when its inputs changed) and replaces everything else.
[ -d "$root/src" ] && find "$root/src" -mindepth 1 -maxdepth 1 ! -name build-cuda -exec rm -rf {} +
rm -rf "$root/kit"
mkdir -p "$root/src" "$root/kit"
(cd "$src" && git ls-files -z -co --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$root/src"
cp -r "$kit/debs" "$kit/packages.txt" "$root/kit/"
log "carried: source $(du -sm --exclude=build-cuda "$root/src" | cut -f1) MiB, kit $(du -sm "$root/kit" | cut -f1) MiB"

# --- on the "node": build, mpirun, the acceptance script's dry run ---------------------------
t=$(date +%s)
code=0
in_chroot 0 "cd /src && bench/device_kit.sh build /kit ${target:+--target $target} $([ $configure_only = 1 ] && echo --configure-only)" 2>&1 |
  tee "$root.build.log" || code=$?
[ "$code" = 0 ] || die "bench/device_kit.sh build failed in the chroot (exit $code; $root.build.log)"
[ "$configure_only" = 0 ] || { log "configured (--configure-only): $(( $(date +%s) - t )) s"; exit 0; }
build_s=$(( $(date +%s) - t ))
# The CI check on the binary the kit built, as it runs (env.sh): every library it
# loads is the kit's, the image's (dpkg -S in the chroot) or torch's/CUDA's.
in_chroot 0 "cd /src && . /kit/env.sh && bench/device_kit.sh closure build-cuda/launcher/batchdist /kit" 2>&1 |
  tee -a "$root.build.log" || die "the kit's closure check failed on the binary it built"
code=0
in_chroot 0 "cd /src && . /kit/env.sh && bench/gpu_acceptance.sh --skip-build --dry-run" 2>&1 |
  tee "$root.acceptance.log" || code=$?
log "build ${build_s} s; gpu_acceptance.sh --skip-build --dry-run: exit $code; all $(( $(date +%s) - t0 )) s"
[ "$code" = 3 ] || die "expected exit 3 (no GPU) from gpu_acceptance.sh, got $code"
grep -q 'no GPU found' "$root.acceptance.log" || die "gpu_acceptance.sh exited 3 without 'no GPU found'"
log "PASSED: the kit built batchdist with no -dev package and no network; the acceptance script stopped at 'no GPU' (exit 3) as expected"
