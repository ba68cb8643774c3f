#!/usr/bin/env bash
# Note [library] (launcher/CMakeLists.txt) end to end: the build installed to a
# temporary prefix, examples/own_model configured and built out of tree against
# it with nothing but find_package(batchdist), then run on 2 real ranks.
#
# usage: library_e2e.sh MPIRUN "MPI FLAGS" BUILD_DIR SOURCE_DIR CXX MODEL_DIFF
#  1. the install: bin/batchdist, lib*/libbatchdist.so, include/batchdist/ and
#     nothing else under include/, the CMake package; the library exports the
#     public API and none of batchdist's internals or private dependencies;
#  2. own_model builds from the installed package alone;
#  3. mpirun -np 2: exits 0, searched the per-GPU batch on both ranks, trained 3
#     epochs with equal shards (G = 128), its validation loss below 0.5 and
#     accuracy above 0.9 (chance: 0.25, loss 1.39), the program's metric in
#     report.json; model.pt written;
#  4. killed (rank 0's SIGKILL just after the checkpoint of step 16, the job ends)
#     and run again: it resumes, and its model.pt is bitwise an uninterrupted run's;
#  5. examples/own_loop (the program's own loop on batchdist::DataParallel, with
#     batchdist::searchBatch on its step and batchdist::EqualShards), built the
#     same way, 2 ranks from different initial weights: the search's table is
#     printed and its choice trained, both ranks learn (loss below 0.3, accuracy
#     above 0.9), and their parameters after training are bitwise equal (rank 0's
#     start, the same averaged gradients, the same steps).
set -u
mpirun=$1 flags=$2 build=$3 src=$4 cxx=$5 model_diff=$6
tmp=$(mktemp -d "${TMPDIR:-/tmp}/batchdist_library.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 1. The install.
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
  { tail -20 "$tmp/install.log"; fail "cmake --install exited $?"; }
lib=$(find "$tmp/prefix" -name 'libbatchdist.so' | head -1)
[ -n "$lib" ] || fail "no libbatchdist.so under the prefix: $(cd "$tmp/prefix" && find . | head -30)"
[ -x "$tmp/prefix/bin/batchdist" ] || fail "no bin/batchdist"
[ -f "$tmp/prefix/include/batchdist/batchdist.h" ] || fail "no include/batchdist/batchdist.h"
others=$(cd "$tmp/prefix/include" && find . -type f ! -path './batchdist/*')
[ -z "$others" ] || fail "headers outside include/batchdist/: $others"
config=$(find "$tmp/prefix" -name batchdistConfig.cmake | head -1)
[ -n "$config" ] || fail "no batchdistConfig.cmake"
"$tmp/prefix/bin/batchdist" --version >"$tmp/version.log" 2>&1 ||
  { cat "$tmp/version.log"; fail "the installed batchdist does not start"; }
nm -DC --defined-only "$lib" >"$tmp/symbols" || fail "nm $lib"
grep -q 'batchdist::Job::Job(' "$tmp/symbols" || fail "the library does not export batchdist::Job"
leaked=$(grep -E 'batchdist::(worker|launcher|collective)::|YAML::|google::protobuf|nlohmann|cv::|boost::' "$tmp/symbols" | head -5)
[ -z "$leaked" ] || fail "the library exports internals: $leaked"

# 2. The example, from the installed package alone.
cmake -S "$src/examples/own_model" -B "$tmp/own_model" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  >"$tmp/configure.log" 2>&1 || { tail -30 "$tmp/configure.log"; fail "configuring own_model"; }
cmake --build "$tmp/own_model" >"$tmp/build.log" 2>&1 ||
  { tail -30 "$tmp/build.log"; fail "building own_model"; }
# Note [libstdc++ first]: the package's link option, for the program and libbatchdist.so.
for f in "$tmp/own_model/own_model" "$lib"; do
  first=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | head -n 1)
  [ "$first" = libstdc++.so.6 ] || fail "the first needed library of $f is $first, not libstdc++.so.6"
done

# 3. Two ranks.
# shellcheck disable=SC2086
timeout 600 "$mpirun" $flags -np 2 "$tmp/own_model/own_model" "$tmp/out" >"$tmp/run.log" 2>&1 ||
  { tail -30 "$tmp/run.log"; fail "own_model exited $?"; }
[ -f "$tmp/out/model.pt" ] || fail "no model.pt"
[ -f "$tmp/out/search.json" ] || { tail -30 "$tmp/run.log"; fail "no search.json: the batch was not searched"; }
python3 - "$tmp/out/report.json" "$tmp/run.log" <<'PY' || { tail -30 "$tmp/run.log"; exit 1; }
import json, sys
r = json.load(open(sys.argv[1]))
log = open(sys.argv[2]).read()
def fail(msg):
    print("FAIL:", msg); sys.exit(1)
m, a, g = r.get("per_gpu_batch", 0), r.get("accum_steps", 0), r.get("global_batch")
if g != 128 or m * a * 2 != 128: fail(f"per-GPU {m} x accumulation {a} x 2 ranks, global {g}: not 128")
if not r.get("completed"): fail("report.json: not completed")
loss, acc = r.get("eval_loss"), r.get("eval_accuracy")
if loss is None or acc is None: fail(f"report.json has no eval_loss/eval_accuracy: {sorted(r)}")
if not (loss < 0.5 and acc > 0.9): fail(f"eval loss {loss}, accuracy {acc}: not learned")
if "the program's module" not in log: fail("the console does not name the program's module")
print(f"own_model: per-GPU {m} x {a} x 2, eval loss {loss:.4f}, accuracy {acc:.4f}")
PY

# 4. kill -9 and resume: a fixed per-GPU batch (no search), a checkpoint every 8 steps.
# own NAME KEY=VALUE...: a 2-rank run of own_model into $tmp/NAME; sets rc.
own() {
  local name=$1; shift
  # shellcheck disable=SC2086
  timeout 600 "$mpirun" $flags -np 2 "$tmp/own_model/own_model" "$tmp/$name" batch.per_gpu=32 \
    checkpoint.every_steps=8 checkpoint.every_minutes=0 dist.timeout_s=20 "$@" >"$tmp/$name.log" 2>&1
  rc=$?
}
own full
[ "$rc" = 0 ] || { tail -20 "$tmp/full.log"; fail "the uninterrupted run exited $rc"; }
BATCHDIST_FAULT_CHECKPOINT=after_rename BATCHDIST_FAULT_CHECKPOINT_STEP=16 own cut
[ "$rc" != 0 ] || fail "the fault did not end the run"
[ -d "$tmp/cut/checkpoints/step-00000016" ] || { tail -20 "$tmp/cut.log"; fail "no checkpoint at step 16"; }
[ ! -f "$tmp/cut/model.pt" ] || fail "the killed run wrote model.pt"
own cut
[ "$rc" = 0 ] || { tail -20 "$tmp/cut.log"; fail "the resumed run exited $rc"; }
grep -q '"resumed_from"' "$tmp/cut/report.json" || { tail -20 "$tmp/cut.log"; fail "the second run did not resume"; }
"$model_diff" "$tmp/full/model.pt" "$tmp/cut/model.pt" 0 || fail "resumed model.pt differs from the uninterrupted run's"
echo "kill at step 16 + resume: model.pt bitwise the uninterrupted run's"

# 5. The program's own loop.
cmake -S "$src/examples/own_loop" -B "$tmp/own_loop" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$tmp/prefix" \
  >"$tmp/loop-configure.log" 2>&1 || { tail -30 "$tmp/loop-configure.log"; fail "configuring own_loop"; }
cmake --build "$tmp/own_loop" >"$tmp/loop-build.log" 2>&1 ||
  { tail -30 "$tmp/loop-build.log"; fail "building own_loop"; }
# shellcheck disable=SC2086
timeout 600 "$mpirun" $flags -np 2 "$tmp/own_loop/own_loop" "$tmp/loop" 200 >"$tmp/loop.log" 2>&1 ||
  { tail -30 "$tmp/loop.log"; fail "own_loop exited $?"; }
python3 - "$tmp/loop.log" <<'PY' || { tail -30 "$tmp/loop.log"; exit 1; }
import re, sys
log = open(sys.argv[1]).read()
chosen = re.search(r"^ +(\d+) +(\d+) +64 .*<- chosen$", log, re.M)
if not chosen or "batch search: 2 rank(s)" not in log: sys.exit("FAIL: own_loop printed no search table with a choice")
finals = re.findall(r"rank (\d): final loss ([0-9.]+), accuracy ([0-9.]+), backend (\w+), per-GPU (\d+) x (\d+)", log)
if sorted(r for r, *_ in finals) != ["0", "1"]: sys.exit(f"FAIL: own_loop's final lines: {finals}")
for rank, loss, acc, backend, m, a in finals:
    if (m, a) != chosen.groups():
        sys.exit(f"FAIL: own_loop rank {rank} trained per-GPU {m} x {a}, the search chose {chosen.groups()}")
    if not (float(loss) < 0.3 and float(acc) > 0.9):
        sys.exit(f"FAIL: own_loop rank {rank}: loss {loss}, accuracy {acc}: not learned")
print(f"own_loop: the search chose per-GPU {chosen[1]} x {chosen[2]}; " +
      "; ".join(f"rank {r}: loss {l}, accuracy {a} ({b})" for r, l, a, b, *_ in finals))
PY
"$model_diff" "$tmp/loop/params-rank0.pt" "$tmp/loop/params-rank1.pt" 0 ||
  fail "own_loop's ranks ended with different parameters"
echo "own_loop: both ranks' parameters bitwise equal after 200 steps"
echo "PASS"
