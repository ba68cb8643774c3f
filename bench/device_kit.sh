#!/usr/bin/env bash
# The air-gapped device kit: build and check batchdist on a GPU node that reaches no
# package registry. Such a node has a CUDA toolkit, CMake, a host compiler and a
# Python environment with the CUDA torch wheel (NCCL from its nvidia-nccl wheel),
# but none of the other libraries batchdist builds against, no mpirun and no
# network. The kit is Debian 12's .deb files of those (headers, link and run-time
# libraries, Open MPI's mpirun/orted and plugins, protoc, the Gloo headers, GTest)
# with their run-time closure, minus what such a node already has: carried beside
# the source tree, unpacked with dpkg-deb -x into a prefix (never into /), and the
# build pointed at it and at the node's own torch (whatever release it is).
#
#   bench/device_kit.sh packages          the kit's package list (apt's lists, no download)
#   bench/device_kit.sh base              what it takes a node's image to have already
#   bench/device_kit.sh pack DIR          apt-get download them into DIR/debs (Debian 12,
#                                         with network); prints DIR's size
#   bench/device_kit.sh build DIR [--build-dir B] [--jobs N] [--target T] [--configure-only]
#                                         on the node: unpack DIR/debs into DIR/prefix,
#                                         write DIR/env.sh, configure and build
#                                         [B: build-cuda beside the source; every core]
#   bench/device_kit.sh run DIR OUT [--budget-s S] [-- gpu_acceptance.sh args...]
#                                         build, then bench/gpu_acceptance.sh --skip-build
#                                         within S seconds in all [600]; OUT gets
#                                         summary.json and the key logs (<= 8 files)
#   bench/device_kit.sh closure BINARY [DIR]
#                                         exit 1 when BINARY (or a library it loads,
#                                         torch's and CUDA's own excepted) needs a shared
#                                         library that neither the kit nor the base image
#                                         has (dpkg -S names a library's package; with
#                                         DIR, a library under DIR/prefix is its .deb's)
#
# The whole thing on a node, in one command (the kit and the clone carried there):
#   bench/device_kit.sh run kit runs/acceptance
# Environment: CUDA_HOME (the node's toolkit, else nvcc on PATH), BATCHDIST_PYTHON
# [python3: the environment with torch].
set -euo pipefail
shopt -s nullglob

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/.." && pwd)
arch=x86_64-linux-gnu

# --- what the kit holds ----------------------------------------------------------
# What the build and the GPU checks use: headers, link libraries and tools.
# (libtorch-dev is not here: the node's torch is the one built against.)
KIT_ROOTS=(
  libgloo-dev                    # c10d's ProcessGroupGloo.hpp includes them (the wheel has none)
  libopenmpi-dev openmpi-bin     # mpi.h, libmpi; mpirun, orted and the MCA plugins
  libyaml-cpp-dev
  libboost-program-options-dev
  nlohmann-json3-dev
  libjpeg-dev libpng-dev
  libopencv-imgproc-dev
  libprotobuf-dev protobuf-compiler  # TensorBoard event messages, compiled by protoc
  libgtest-dev                   # the test targets
)
# -dev packages a root pulls in whose headers or link names the build uses; every
# other -dev of a dependency (libhwloc-dev, libibverbs-dev, libtbb-dev, ...) is left
# out: batchdist includes none of their headers, and their libraries come in as
# the run-time packages the libraries above depend on.
KIT_DEV=(libopencv-core-dev libboost-program-options1.74-dev libboost1.74-dev
         libjpeg62-turbo-dev zlib1g-dev)
# Depended on, but not needed to build or to run on one node; left out (with why).
KIT_PRUNE=(
  gfortran-12 gfortran-mod-15    # libopenmpi-dev: the Fortran bindings' compiler
  libjs-jquery libjs-jquery-ui   # libopenmpi-dev: HTML docs
  libhwloc-plugins               # hwloc dlopens them if present (X11, NVCtrl, OpenCL, PCI
                                 # via libxml2 + libicu72: 10+ MB); topology works without
  libglx-mesa0                   # libGLX (OpenCV core links it) dispatches to a GL vendor
                                 # only when GL is used: batchdist never does (libllvm: 23 MB)
  openssh-client ssh-client      # mpirun's remote launch; one node needs none (env.sh
                                 # sets OMPI_MCA_plm_rsh_agent so its absence is no error)
  adduser                        # libibverbs1's maintainer script; dpkg-deb -x runs none
  googletest                     # libgtest-dev: GTest's sources (the built libraries and
                                 # headers are in libgtest-dev itself)
)
# What a GPU node's image already has: the C library and C++ run time, the host
# compiler's toolchain, zlib and the other Priority: required libraries of a
# Debian/Ubuntu base image. Never packed; `closure` accepts them.
KIT_BASE=(
  libc6 libc6-dev libc-dev-bin linux-libc-dev libcrypt1 libcrypt-dev libnsl2 libnsl-dev
  libtirpc3 libtirpc-dev libtirpc-common rpcsvc-proto libgssapi-krb5-2 libkrb5-3
  libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2
  libgcc-s1 libgcc-12-dev libstdc++6 libstdc++-12-dev gcc-12-base libgomp1 libatomic1
  libquadmath0 libitm1 libasan8 liblsan0 libtsan2 libubsan1 libcc1-0
  gcc gcc-12 g++ g++-12 cpp cpp-12 binutils binutils-common binutils-x86-64-linux-gnu
  libbinutils libctf0 libctf-nobfd0 libgprofng0 libjansson4 libisl23 libmpc3 libmpfr6 libgmp10
  zlib1g libzstd1 liblzma5 libbz2-1.0 liblz4-1 libselinux1 libpcre2-8-0 libtinfo6
  libudev1 libsystemd0 libcap2 libgcrypt20 libgpg-error0 libuuid1 libblkid1 libmount1
  libmd0 libdb5.3 libacl1 libattr1 libaudit1 libaudit-common libcap-ng0
  libpam0g libsemanage2 libsepol2 libssl3 libffi8 libexpat1 libsqlite3-0 libncursesw6
  debconf dpkg perl-base tar gzip sed coreutils bash debianutils
  python3 python3-minimal python3.11 python3.11-minimal libpython3.11-minimal
  libpython3.11-stdlib libpython3-stdlib
)

# The kit's packages, one a line, sorted: KIT_ROOTS and their Depends/PreDepends
# (the first installable alternative, a virtual package's first provider), not
# following KIT_PRUNE, KIT_BASE or a -dev outside KIT_DEV. Reads apt's lists only
# (after apt-get update), so CI computes it offline.
kit_packages() {
  apt-cache show libopenmpi3 >/dev/null 2>&1 ||
    die "apt knows no package libopenmpi3: its package lists are empty or not Debian 12's (apt-get update first)"
  KIT_ROOTS="${KIT_ROOTS[*]}" KIT_DEV="${KIT_DEV[*]}" KIT_PRUNE="${KIT_PRUNE[*]}" \
    KIT_BASE="${KIT_BASE[*]}" python3 - <<'PY'
import os, subprocess, sys

roots, dev, prune, base = (os.environ[k].split() for k in ("KIT_ROOTS", "KIT_DEV", "KIT_PRUNE", "KIT_BASE"))
dev, prune, base = set(dev), set(prune), set(base)

def depends(pkgs):
    """{package: [[alternative, ...], ...]}; an alternative is a name or (virtual, [providers])."""
    out = subprocess.run(["apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
                          "--no-breaks", "--no-replaces", "--no-enhances", *pkgs],
                         capture_output=True, text=True, check=True).stdout
    deps, pkg, group, cont = {}, None, None, False
    for line in out.splitlines():
        if not line.startswith(" "):
            pkg = line.strip()
            deps[pkg], cont = [], False
        elif line.startswith("    "):  # a provider of the virtual package just named
            group[-1][1].append(line.strip())
        else:
            kind, _, name = line.strip().lstrip("|").partition(": ")
            if kind not in ("Depends", "PreDepends"):
                cont = False
                continue
            alt = (name.strip("<>"), []) if name.startswith("<") else name.split(":")[0]
            if not cont:
                group = []
                deps[pkg].append(group)
            group.append(alt)
            cont = line.startswith(" |")
    return deps

def names(alt):  # a virtual package named in KIT_PRUNE prunes its providers too
    if isinstance(alt, tuple):
        return [] if alt[0] in prune else alt[1]
    return [alt]

def left_out(name):
    return name in prune or name in base or (name.endswith("-dev") and name not in dev and name not in roots)

chosen, frontier = set(), list(roots)
while frontier:
    chosen.update(frontier)
    nxt = []
    for pkg, groups in depends(frontier).items():
        for group in groups:
            cands = [n for alt in group for n in names(alt)]
            if any(n in chosen or n in nxt or n in base for n in cands):
                continue
            take = [n for n in cands if not left_out(n)]
            if take:
                nxt.append(take[0])
    frontier = sorted(set(nxt) - chosen)
print("\n".join(sorted(chosen)))
PY
}

die() { echo "device_kit: error: $*" >&2; exit 1; }
log() { echo "device_kit: $*" >&2; }
need_kit() {
  compgen -G "$1/debs/*.deb" >/dev/null ||
    die "no .deb files in $1/debs (bench/device_kit.sh pack $1, on Debian 12 with network)"
}

# --- pack: the .deb files -----------------------------------------------------------
cmd_pack() {
  local dir=$1
  mkdir -p "$dir/debs"
  dir=$(cd "$dir" && pwd)
  kit_packages >"$dir/packages.txt"
  rm -f "$dir"/debs/*.deb
  # apt-get download writes into the current directory; as root it warns that the
  # _apt sandbox cannot write there unless the directory is _apt's.
  chown _apt "$dir/debs" 2>/dev/null || true
  (cd "$dir/debs" && xargs apt-get download -q <"$dir/packages.txt" >/dev/null)
  local n mib
  n=$(wc -l <"$dir/packages.txt")
  mib=$(du -sk "$dir" | awk '{printf "%.1f", $1 / 1024}')
  echo "device_kit: $n packages, $(du -sk "$dir/debs" | awk '{printf "%.1f", $1 / 1024}') MiB of .deb files; $dir: $mib MiB"
  echo "largest:"
  find "$dir/debs" -name '*.deb' -printf '%s %f\n' | sort -rn | head -n 8 |
    awk '{printf "  %6.1f MiB  %s\n", $1 / 1048576, $2}'
}

# --- build: unpack into a prefix, configure against it and the node's torch -------------
# env.sh: what the binary, mpirun and protoc need at run time from the prefix. Open
# MPI finds its plugins, help files and wrapper data under OPAL_PREFIX (Debian's
# are configured with prefix /usr).
write_env() {
  local dir=$1 p=$1/prefix/usr
  cat >"$dir/env.sh" <<EOF
# Written by bench/device_kit.sh build: source it before running batchdist or mpirun.
export KIT_PREFIX='$p'
export OPAL_PREFIX='$p'
# PMIx (Open MPI's launch interface) has its own prefix, for its help files.
export PMIX_INSTALL_PREFIX='$p/lib/$arch/pmix2'
export PATH='$p/bin':\$PATH
export LD_LIBRARY_PATH='$p/lib/$arch':'$p/lib/$arch/openmpi/lib'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
# One node: Open MPI starts its ranks itself; without ssh on the node its rsh
# launcher would refuse to start (it is never called for local ranks).
command -v ssh >/dev/null 2>&1 || export OMPI_MCA_plm_rsh_agent=false
# The node is likely a container with root as its user.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
EOF
}

unpack_kit() {
  local dir=$1 prefix=$1/prefix
  need_kit "$dir"
  if [ -f "$prefix/.kit-unpacked" ] && [ "$(cat "$prefix/.kit-unpacked")" = "$(cd "$dir/debs" && ls)" ]; then
    return 0
  fi
  rm -rf "$prefix"
  mkdir -p "$prefix"
  local deb
  for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
  local p=$prefix/usr b
  # What Debian's maintainer scripts would do: the alternatives' links (mpirun, mpicxx).
  for b in mpirun mpiexec mpicxx mpic++ mpicc; do
    [ -e "$p/bin/$b.openmpi" ] && ln -sf "$b.openmpi" "$p/bin/$b"
  done
  # Debian's absolute links (libfoo.so -> /lib/...) would point at the node's /.
  local l t
  while IFS= read -r l; do
    t=$(readlink "$l")
    case $t in /*) ln -sfn "$prefix$t" "$l" ;; esac
  done < <(find "$prefix" -type l)
  # Debian's alternatives for BLAS and LAPACK (libopencv_core needs libblas.so.3 and
  # liblapack.so.3): update-alternatives links them from lib/<arch>/{blas,lapack}/.
  for l in "$p/lib/$arch"/blas/lib*.so.* "$p/lib/$arch"/lapack/lib*.so.*; do
    [ -e "$p/lib/$arch/${l##*/}" ] || ln -s "${l#"$p/lib/$arch/"}" "$p/lib/$arch/${l##*/}"
  done
  # Libraries some packages install under /lib (not /usr/lib).
  if [ -d "$prefix/lib/$arch" ]; then
    for l in "$prefix/lib/$arch"/*; do [ -e "$p/lib/$arch/${l##*/}" ] || ln -s "$l" "$p/lib/$arch/"; done
  fi
  (cd "$dir/debs" && ls) >"$prefix/.kit-unpacked"
}

cmd_build() {
  local dir=$1 build="$src/build-cuda" jobs target="" configure_only=0
  shift
  jobs=$(nproc)
  while [ $# -gt 0 ]; do
    case $1 in
      --build-dir) build=$2; shift 2 ;;
      --jobs) jobs=$2; shift 2 ;;
      --target) target=$2; shift 2 ;;
      --configure-only) configure_only=1; shift ;;
      *) die "build: unknown argument '$1'" ;;
    esac
  done
  dir=$(cd "$dir" && pwd)
  case $build in /*) ;; *) build="$PWD/$build" ;; esac
  local t0 t
  t0=$(date +%s)
  unpack_kit "$dir"
  write_env "$dir"
  # shellcheck source=/dev/null
  . "$dir/env.sh"
  local p=$dir/prefix/usr py=${BATCHDIST_PYTHON:-python3} torch_cmake cuda nvcc
  torch_cmake=$("$py" -W ignore -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) ||
    die "'$py -c \"import torch\"' failed: activate the environment with the CUDA torch wheel (or set BATCHDIST_PYTHON)"
  if [ -n "${CUDA_HOME:-}" ]; then cuda=$CUDA_HOME
  elif nvcc=$(command -v nvcc); then cuda=$(cd "$(dirname "$nvcc")/.." && pwd)
  else cuda=/usr/local/cuda
  fi
  [ -x "$cuda/bin/nvcc" ] || die "no nvcc in $cuda/bin: set CUDA_HOME to the node's CUDA toolkit"
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  # A build directory configured against another prefix, torch or toolkit keeps their
  # paths in its cache: start that cache afresh.
  local inputs="kit=$p torch=$torch_cmake cuda=$cuda"
  if [ -f "$build/CMakeCache.txt" ] && [ "$(cat "$build/device_kit.inputs" 2>/dev/null)" != "$inputs" ]; then
    rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
  fi
  mkdir -p "$build"
  log "configure: torch $torch_cmake, CUDA $cuda, the kit's prefix $p"
  t=$(date +%s)
  # CMAKE_PREFIX_PATH finds the kit's CMake configs (Boost, yaml-cpp, nlohmann-json,
  # GTest) and, through <prefix>/lib/<arch>, its libraries and headers; protoc and
  # the MPI wrapper by their paths. The compiler searches <prefix>/include/<arch>
  # (jconfig.h, OpenCV's cvconfig.h) as it does /usr/include/<arch>. The wrapper (opal_wrapper) relocates by
  # OPAL_PREFIX (env.sh). The binary's search path is a DT_RPATH (not the RUNPATH
  # the linker writes by default), which also serves the libraries its libraries
  # load (OpenCV's BLAS); but not those of Debian's libmpi, which has a RUNPATH of
  # its own: run batchdist (and mpirun) with env.sh sourced.
  local rpath="$p/lib/$arch;$p/lib/$arch/openmpi/lib"
  PATH="$cuda/bin:$PATH" CUDACXX="$cuda/bin/nvcc" \
    cmake -S "$src" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$torch_cmake;$p" \
      -DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=BOTH \
      -DCMAKE_INCLUDE_PATH="$p/include/opencv4" \
      -DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES="$p/include/$arch" \
      -DMPI_CXX_COMPILER="$p/bin/mpicxx.openmpi" -DMPIEXEC_EXECUTABLE="$p/bin/mpirun" \
      -DProtobuf_PROTOC_EXECUTABLE="$p/bin/protoc" \
      -DCUDAToolkit_ROOT="$cuda" -DCMAKE_CUDA_COMPILER="$cuda/bin/nvcc" \
      -DTORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" \
      -DCMAKE_BUILD_RPATH="$rpath" -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath-link,$p/lib/$arch" \
      -DCMAKE_SHARED_LINKER_FLAGS="-Wl,-rpath-link,$p/lib/$arch" \
      -DBATCHDIST_REQUIRE_NCCL=ON >"$build/configure.log" 2>&1 ||
    { tail -n 40 "$build/configure.log" >&2; die "configure failed (last lines above; $build/configure.log)"; }
  echo "$inputs" >"$build/device_kit.inputs"
  grep -E '^-- batchdist:' "$build/configure.log" >&2 || true
  log "configure: $(( $(date +%s) - t )) s"
  [ "$configure_only" = 0 ] || return 0
  t=$(date +%s)
  cmake --build "$build" -j"$jobs" ${target:+--target "$target"} >"$build/build.log" 2>&1 ||
    { tail -n 40 "$build/build.log" >&2; die "build failed (last lines above; $build/build.log)"; }
  log "build: $(( $(date +%s) - t )) s (-j$jobs${target:+, target $target})"
  local bin=$build/launcher/batchdist
  if ldd "$bin" | grep 'not found' >&2; then die "$bin: libraries not found (above)"; fi
  # Note [libstdc++ first]: the link should list libstdc++.so.6 first; on the first
  # GPU node it did not, for a reason not yet known: say so, with the link command
  # and the toolchain (the binary's guard still runs it with libstdc++ preloaded).
  local first
  first=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | head -n 1)
  log "$bin: first needed library $first"
  if [ "$first" != libstdc++.so.6 ]; then
    log "the link did not keep libstdc++.so.6 first (Note [libstdc++ first]); its command and toolchain:"
    { (cd "$build" && ninja -t commands launcher/batchdist 2>/dev/null | tail -n 1) ||
        cat "$build/launcher/CMakeFiles/batchdist.dir/link.txt"; } >&2 || true
    { ld --version | head -n 1; c++ -v 2>&1 | tail -n 1; c++ -dumpspecs | grep -A1 '^\*link:'; } >&2 || true
  fi
  "$bin" --version >&2 || die "$bin --version failed"
  mpirun -np 2 "$bin" --version >/dev/null || die "mpirun -np 2 $bin --version failed (the kit's Open MPI)"
  log "built in $(( $(date +%s) - t0 )) s: $bin; run it (and mpirun) after: . $dir/env.sh"
}

# --- run: build, then the GPU acceptance within a time budget -----------------------------
cmd_run() {
  local dir=$1 out=$2 budget=600 rest=()
  shift 2
  while [ $# -gt 0 ]; do
    case $1 in
      --budget-s) budget=$2; shift 2 ;;
      --) shift; rest=("$@"); break ;;
      *) die "run: unknown argument '$1'" ;;
    esac
  done
  local t0 code=0 build="$src/build-cuda"
  t0=$(date +%s)
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  # The build in a process of its own: its errors end it, not this one, so the
  # summary below still says what failed.
  if ! "$0" build "$dir" --build-dir "$build" >"$out/build.log" 2>&1; then
    tail -n 20 "$out/build.log" >&2
    printf '{"ok": false, "failed_steps": ["build"], "log": "build.log"}\n' >"$out/summary.json"
    die "build failed; $out/build.log"
  fi
  dir=$(cd "$dir" && pwd)
  # shellcheck source=/dev/null
  . "$dir/env.sh"
  # Every step's outputs stay in the kit's directory; OUT gets at most 8 files.
  local full
  full="$dir/acceptance-$(date +%Y%m%d-%H%M%S)"
  local left=$(( budget - ($(date +%s) - t0) )) py=${BATCHDIST_PYTHON:-python3} venv
  venv=$("$py" -c 'import sys; print(sys.prefix)')
  log "built in $(( $(date +%s) - t0 )) s; $left s left for bench/gpu_acceptance.sh"
  "$here/gpu_acceptance.sh" --skip-build --build-dir "$build" --venv "$venv" \
    --budget-s "$left" --out "$full" "${rest[@]}" 2>&1 | tee "$out/acceptance.log" || code=$?
  # What comes back (<= 8 files): the summary, the build's and the acceptance
  # script's output, the steps' table and one file of every step's log per world.
  [ -f "$full/summary.json" ] && cp "$full/summary.json" "$out/"
  [ -f "$full/steps.tsv" ] && cp "$full/steps.tsv" "$out/"
  local w
  for w in "$full"/w*; do
    tail -n +1 "$w"/*/log >"$out/logs-${w##*/}.txt" 2>/dev/null || true
  done
  log "run: exit $code after $(( $(date +%s) - t0 )) s; $out/summary.json (every output: $full)"
  return "$code"
}

# --- closure: every shared library the binary needs is the kit's, the base's or torch's ------
# dpkg -S names a library's package on the Debian machine that built BINARY; one
# under the kit's prefix is the package of the .deb that holds it.
declare -A kit_file=()
owner() {
  local f=$1 r
  if [ -n "${kit_prefix:-}" ] && [ "${f#"$kit_prefix"/}" != "$f" ]; then
    echo "${kit_file[${f#"$kit_prefix"}]:-${kit_file[$(readlink -f "$f" | sed "s|^$kit_prefix||")]:-}}"
    return
  fi
  r=$(dpkg -S "$f" 2>/dev/null || dpkg -S "$(readlink -f "$f")" 2>/dev/null ||
      dpkg -S "/usr${f#/usr}" 2>/dev/null || dpkg -S "${f#/usr}" 2>/dev/null || true)
  r=${r%%:*}
  echo "${r%%,*}"
}
cmd_closure() {
  local bin=$1 kit deb f
  [ -e "$bin" ] || die "closure: no $bin"
  kit_prefix=""
  if [ -n "${2:-}" ]; then
    need_kit "$2"
    kit_prefix=$(cd "$2" && pwd)/prefix
    for deb in "$2"/debs/*.deb; do
      while read -r f; do kit_file[${f#.}]=$(dpkg-deb -f "$deb" Package); done \
        < <(dpkg-deb -c "$deb" | awk '{print $6}' | grep -E '\.so(\.|$)')
    done
  fi
  kit=$(kit_packages)
  # Sonames the kit's packages provide as virtual packages (libblas3: libblas.so.3): a
  # library that Debian's alternatives resolve to another provider here is the kit's too.
  local provides
  provides=$(xargs apt-cache show --no-all-versions <<<"$kit" | sed -n 's/^Provides: //p' |
    tr ',' '\n' | sed 's/^ *//; s/ .*//' | sort -u)
  # The resolved path of each library ldd loads (the whole closure, in load order),
  # and for each, who needs it (readelf -d NEEDED), to stop below torch's libraries.
  declare -A path=() seen=()
  local name p
  while read -r name p; do path[$name]=$p; done < <(ldd "$bin" | awk '$2 == "=>" {print $1, $3; next}
    $1 ~ /^\// {n = split($1, p, "/"); print p[n], $1}')
  local queue=("$bin") fails=0 ok=0 torch=0 f lib pkg why
  while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}
    queue=("${queue[@]:1}")
    while read -r lib; do
      [ -n "${seen[$lib]:-}" ] && continue
      seen[$lib]=1
      p=${path[$lib]:-}
      if [ -z "$p" ] || [ "$p" = "not" ]; then
        echo "FAIL $lib (needed by ${f##*/}): not found"; fails=$((fails + 1)); continue
      fi
      # torch's own libraries come with the node's torch, and so does what they load;
      # CUDA's and NCCL's with its CUDA toolkit, driver and torch's NVIDIA wheels.
      case ${lib} in
        libtorch*|libc10*|libshm.so*|libcaffe2*|libcuda.so*|libcudart.so*|libnvrtc*|libnccl.so*|\
        libcublas*|libcudnn*|libcufft*|libcurand*|libcusparse*|libcusolver*|libnvJitLink*|\
        libnvToolsExt*|libnvtx*|libcupti*) torch=$((torch + 1)); continue ;;
      esac
      case $p in */site-packages/*) torch=$((torch + 1)); continue ;; esac
      pkg=$(owner "$p")
      if [ -z "$pkg" ] && grep -qxF "$lib" <<<"$provides"; then ok=$((ok + 1)); continue; fi
      if [ -n "$pkg" ] && ! grep -qx "$pkg" <<<"$kit" && grep -qxF "$lib" <<<"$provides"; then
        ok=$((ok + 1)); continue  # another provider here; the kit's brings its own needs
      fi
      if [ -z "$pkg" ]; then why="no Debian package owns $p"
      elif grep -qx "$pkg" <<<"$kit"; then why=""
      # Not `printf | grep -q` under pipefail: grep -q leaves at its first match, and a
      # printf still writing then dies of SIGPIPE, failing the pipeline (under load).
      elif grep -qxF "$pkg" < <(printf '%s\n' "${KIT_BASE[@]}"); then why=""
      else why="$p is in package $pkg, which the kit does not pack (bench/device_kit.sh: KIT_ROOTS/KIT_DEV/KIT_PRUNE)"
      fi
      if [ -n "$why" ]; then
        echo "FAIL $lib (needed by ${f##*/}): $why"; fails=$((fails + 1))
      else
        ok=$((ok + 1)); queue+=("$p")
      fi
    done < <(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  done
  echo "device_kit closure: $bin: $ok libraries from the kit or the base image, $torch from torch or CUDA, $fails missing"
  [ "$fails" = 0 ]
}

case ${1:-} in
  packages) kit_packages ;;
  base) printf '%s\n' "${KIT_BASE[@]}" ;;
  pack) [ $# = 2 ] || die "usage: pack DIR"; cmd_pack "$2" ;;
  build) [ $# -ge 2 ] || die "usage: build DIR [--build-dir B] [--jobs N] [--target T]"; shift; cmd_build "$@" ;;
  run) [ $# -ge 3 ] || die "usage: run DIR OUT [--budget-s S] [-- gpu_acceptance args]"; shift; cmd_run "$@" ;;
  closure) { [ $# -ge 2 ] && [ $# -le 3 ]; } || die "usage: closure BINARY [DIR]"; cmd_closure "$2" "${3:-}" ;;
  -h|--help|"") sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; [ -n "${1:-}" ] ;;
  *) echo "device_kit.sh: unknown command '$1' (see --help)" >&2; exit 2 ;;
esac
