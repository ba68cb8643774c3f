#!/usr/bin/env bash
# Checkpoints and resume with real ranks, real signals and kill -9 (Note
# [checkpoint] in worker/train/checkpoint/checkpoint.h). Each scenario compares the final
# model.pt of an interrupted-then-resumed run with an uninterrupted run's, tensor
# by tensor (model_diff).
#
# usage: checkpoint_resume.sh MPIRUN "MPI FLAGS" BATCHDIST MODEL_DIFF CONFIG OUTDIR SCENARIO
#   kill9      kill -9 of every rank after a checkpoint, --resume auto on 2 ranks: bitwise equal
#   signal     SIGTERM to one rank: a checkpoint at the agreed step, exit 143; resume: bitwise
#              equal to a run that checkpointed every 0.12 s (checkpoint.every_minutes)
#   world_2_3  2 ranks -> 3 ranks (G = 96, no BatchNorm): within 1e-5, steps and samples once
#   world_4_2  4 ranks -> 2 ranks (G = 64, no BatchNorm): within 1e-5
#   world_32_8 32 ranks -> 8 ranks (G = 128, no BatchNorm, oversubscribed): within 1e-5
#   shard_2_3  world_2_3 under dist.shard: optimizer (the uninterrupted run unsharded):
#              the sharded state written by slices and re-sliced for 3 ranks; within 1e-5
#   params_2_3 the same under dist.shard: parameters (Note [parameter units]): model.pt
#              and the checkpoint written whole from the shards
#   torn       rank 0 killed between writing files and the rename: the partial one is
#              ignored; a bit-flipped and a truncated checkpoint are refused by name;
#              another optim.momentum is refused naming the key (exit 2)
#   full_disk  checkpoint.dir on a tiny tmpfs: the second write fails with the cause,
#              training goes on, the first checkpoint still loads (skipped: no mount)
#   read_only  checkpoint.dir under a regular file: every write fails with the cause,
#              the report lists them; a stop whose checkpoint fails exits 1
set -u
mpirun=$1 flags=$2 bin=$3 diff=$4 cfg=$5 out=$6 scenario=$7
rm -rf "$out"; mkdir -p "$out"
. "$(dirname "$0")/mpi_job_lib.sh"

# run NAME NP ARGS...: one batchdist run into $out/NAME (log in $out/NAME.log); sets rc.
run() {
  run_into "$@"
  grep -aoE '(resume: |error: |warning: resume|was not written|done: |stopped early).*' "$out/$1.log" | sort -u | head -n 8
}

json() { grep -o "\"$2\": [^,]*" "$out/$1/report.json" | head -1 | sed 's/.*: //'; }

same_model() {  # same_model A B TOLERANCE
  "$diff" "$out/$1/model.pt" "$out/$2/model.pt" "$3" || fail "model.pt of $2 differs from $1's beyond $3"
}

# Starts a run in the background (pid $launcher) and waits (bounded) for PATTERN in its log.
start_until() {
  local name=$1 np=$2 pattern=$3; shift 3
  # shellcheck disable=SC2086
  "$mpirun" $flags -np "$np" "$bin" "$cfg" --output "$out/$name" "$@" >"$out/$name.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 600); do
    grep -q "$pattern" "$out/$name.log" 2>/dev/null && return 0
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.05
  done
  cat "$out/$name.log"; fail "no '$pattern' in the log of $name"
}

ranks_of() { pgrep -f -- "--output $out/$1" | while read -r p; do [ "$(ps -o comm= -p "$p")" = batchdist ] && echo "$p"; done; }

# A quickstart long enough to interrupt: 30 epochs of 22 steps, dropout (the RNG must be restored).
base=(--set train.epochs=30 --set model.dropout=0.1 --set checkpoint.every_steps=20)

case "$scenario" in
  kill9)
    run full 2 "${base[@]}"; [ "$rc" = 0 ] || fail "uninterrupted run: exit $rc"
    start_until cut 2 "checkpoint: step 40 " "${base[@]}" --set checkpoint.every_minutes=0 \
      --set dist.timeout_s=20
    for p in $(ranks_of cut); do kill -9 "$p"; done
    wait "$launcher"; echo "killed every rank: mpirun exit $?"
    [ ! -f "$out/cut/report.json" ] || fail "the run finished before the kill; make it longer"
    cp -r "$out/cut" "$out/resumed"
    run resumed 2 "${base[@]}" --resume auto
    [ "$rc" = 0 ] || fail "resumed run: exit $rc"
    grep -q '"resumed_from"' "$out/resumed/report.json" || fail "no resumed_from in the report"
    [ "$(json resumed steps)" = "$(json full steps)" ] || fail "steps $(json resumed steps) != $(json full steps)"
    [ "$(json resumed samples)" = "$(json full samples)" ] || fail "samples counted twice or lost"
    same_model full resumed 0
    ;;
  signal)
    # The uninterrupted run checkpoints by time (every ~0.1 s: rank 0's clock, agreed
    # in the gradient allreduce), which must not change a single bit of the result.
    run full 2 "${base[@]}" --set checkpoint.every_steps=0 --set checkpoint.every_minutes=0.002
    [ "$rc" = 0 ] || fail "uninterrupted run: exit $rc"
    n=$(grep -c '"on_signal": false' "$out/full/report.json")
    [ "$n" -ge 2 ] || fail "only $n time-driven checkpoints"
    echo "uninterrupted run: $n time-driven checkpoints"
    start_until cut 2 "checkpoint: step 20 " "${base[@]}" --set checkpoint.every_steps=10
    victim=$(ranks_of cut | tail -1)
    kill -TERM "$victim"
    wait "$launcher"; code=$?
    [ "$code" = 143 ] || fail "exit $code after SIGTERM, expected 143"
    grep -q '(stop signal)' "$out/cut.log" || fail "no stop-signal checkpoint line"
    grep -q '"on_signal": true' "$out/cut/report.json" || fail "report lists no stop-signal checkpoint"
    run cut 2 "${base[@]}" --set checkpoint.every_steps=10 --resume auto
    [ "$rc" = 0 ] || fail "resumed run: exit $rc"
    [ "$(json cut completed)" = true ] || fail "resumed run not completed"
    same_model full cut 0
    ;;
  world_2_3 | world_4_2 | world_32_8 | shard_2_3 | params_2_3)
    from=${scenario#*_} to=${scenario##*_}
    from=${from%_*}
    case $from in 2) g=96 ;; 4) g=64 ;; *) g=128 ;; esac
    args=(--set model.batchnorm=false --set batch.global=$g --set train.epochs=4
          --set checkpoint.every_steps=20 --set train.threads=1)
    shard=() kind=""
    case $scenario in
      shard_2_3) kind=optimizer line='update: dist.shard: optimizer (ZeRO-1)' ;;
      params_2_3) kind=parameters line='update: dist.shard: parameters (ZeRO-3)' ;;
    esac
    [ -n "$kind" ] && shard=(--set dist.shard=$kind)
    run full "$from" "${args[@]}"; [ "$rc" = 0 ] || fail "uninterrupted run: exit $rc"
    # Rank 0 dies right after the first checkpoint is in place (before 'latest').
    BATCHDIST_FAULT_CHECKPOINT=after_rename run cut "$from" "${args[@]}" "${shard[@]}" --set dist.timeout_s=20
    [ "$rc" != 0 ] || fail "the fault did not end the run"
    [ -d "$out/cut/checkpoints/step-00000020" ] || fail "no checkpoint at step 20"
    if [ -n "$kind" ]; then
      [ -f "$out/cut/checkpoints/step-00000020/optimizer_state.bin" ] || fail "no optimizer_state.bin"
      [ ! -e "$out/cut/checkpoints/step-00000020/optimizer.pt" ] || fail "a sharded run wrote optimizer.pt"
    fi
    run cut "$to" "${args[@]}" "${shard[@]}" --resume auto
    if [ -n "$kind" ]; then
      [ "$(json cut shard)" = "\"$kind\"" ] || fail "report shard $(json cut shard), expected $kind"
      grep -qF "$line" "$out/cut.log" || fail "no update line '$line'"
    fi
    [ "$rc" = 0 ] || fail "resumed run on $to ranks: exit $rc"
    grep -q '"world_size_then": '"$from" "$out/cut/report.json" || fail "resumed_from lacks world_size_then $from"
    [ "$(json cut world_size)" = "$to" ] || fail "world size $(json cut world_size) != $to"
    [ "$(json cut global_batch)" = "$g" ] || fail "global batch changed"
    [ "$(json cut steps)" = "$(json full steps)" ] || fail "steps $(json cut steps) != $(json full steps)"
    [ "$(json cut samples)" = "$(json full samples)" ] || fail "samples $(json cut samples) != $(json full samples)"
    same_model full cut 1e-5
    # A world size the global batch cannot be split over is refused, listing those that work.
    run cut 5 "${args[@]}" --resume auto
    [ "$rc" = 2 ] || fail "resume on 5 ranks: exit $rc, expected 2"
    grep -q 'world sizes that work: 1, 2, ' "$out/cut.log" || fail "no list of world sizes"
    ;;
  torn)
    args=(--set train.epochs=4 --set checkpoint.every_steps=20)
    run full 2 "${args[@]}"; [ "$rc" = 0 ] || fail "uninterrupted run: exit $rc"
    # Checkpoints 20 and 40 written, then rank 0 killed inside the write of 60.
    BATCHDIST_FAULT_CHECKPOINT=after_files BATCHDIST_FAULT_CHECKPOINT_STEP=60 \
      run cut 2 "${args[@]}" --set dist.timeout_s=20
    [ "$rc" != 0 ] || fail "the fault did not end the run"
    ls -a "$out/cut/checkpoints"
    ls -d "$out"/cut/checkpoints/.tmp-step-00000060-* >/dev/null 2>&1 || fail "no partial write left"
    [ ! -d "$out/cut/checkpoints/step-00000060" ] || fail "a partial checkpoint got its final name"
    # Damage 40 (one flipped bit) and keep a truncated copy as 50: neither may load.
    cp -r "$out/cut/checkpoints/step-00000040" "$out/cut/checkpoints/step-00000050"
    f="$out/cut/checkpoints/step-00000040/optimizer.pt"
    printf "$(printf '\\%03o' $(( $(od -An -tu1 -j100 -N1 "$f") ^ 1 )))" |
      dd of="$f" bs=1 seek=100 conv=notrunc status=none
    truncate -s -10 "$out/cut/checkpoints/step-00000050/model.pt"
    run cut 2 "${args[@]}" --resume "$out/cut/checkpoints/step-00000040"
    [ "$rc" = 2 ] || fail "--resume of a damaged checkpoint: exit $rc, expected 2"
    grep -q 'step-00000040 cannot be loaded: optimizer.pt: checksum mismatch' "$out/cut.log" || fail "the refusal does not name the file and the checksum"
    # Another optimizer setting: refused, naming the key (exit 2).
    run cut 2 "${args[@]}" --set optim.momentum=0.5 --resume auto
    [ "$rc" = 2 ] || fail "resume with another optim.momentum: exit $rc, expected 2"
    grep -q 'optim.momentum = 0.5 now, 0.9 in the checkpoint' "$out/cut.log" || fail "the refusal does not name optim.momentum"
    run cut 2 "${args[@]}" --resume auto
    [ "$rc" = 0 ] || fail "resume: exit $rc"
    grep -q 'not loading checkpoint .*step-00000050: model.pt: .* (truncated?)' "$out/cut.log" || fail "truncated 50 not named"
    grep -q 'not loading checkpoint .*step-00000040: optimizer.pt: checksum mismatch' "$out/cut.log" || fail "damaged 40 not named"
    grep -q 'resume: continuing from .*step-00000020 ' "$out/cut.log" || fail "did not take step 20"
    [ "$(grep -o '"step": [0-9]*' "$out/cut/report.json" | head -1)" = '"step": 20' ] || fail "resumed_from.step is not 20"
    same_model full cut 0
    ;;
  full_disk)
    mkdir -p "$out/disk"
    if ! mount -t tmpfs -o size=200k tmpfs "$out/disk" 2>"$out/mount.err"; then
      echo "SKIP: cannot mount a tmpfs here ($(cat "$out/mount.err")); run as root with CAP_SYS_ADMIN"
      exit 77
    fi
    trap 'umount "$out/disk" 2>/dev/null' EXIT
    # One checkpoint of the quickstart (~150 KiB) fits, a second does not.
    args=(--set train.epochs=3 --set checkpoint.every_steps=20 --set checkpoint.keep=1
          --set checkpoint.dir="$out/disk")
    run cut 2 "${args[@]}"
    [ "$rc" = 0 ] || fail "a full disk for checkpoints ended training (exit $rc)"
    grep -q 'checkpoint at step 40 was not written: .*No space left on device' "$out/cut.log" || fail "no message naming the cause"
    grep -q 'Earlier checkpoints in .* are untouched' "$out/cut.log" || fail "message does not say earlier ones are kept"
    grep -q '"error": ".*No space left on device' "$out/cut/report.json" || fail "report lacks the failed write"
    [ -d "$out/disk/step-00000020" ] || fail "the good checkpoint is gone"
    run cut 2 "${args[@]}" --resume "$out/disk/step-00000020"
    [ "$rc" = 0 ] || fail "resume from the surviving checkpoint: exit $rc"
    grep -q '"step": 20' "$out/cut/report.json" || fail "did not resume from step 20"
    ;;
  read_only)
    : >"$out/file"
    args=(--set train.epochs=100000 --set checkpoint.every_steps=5 --set checkpoint.dir="$out/file/ckpt")
    start_until cut 2 "was not written" "${args[@]}" --set dist.timeout_s=30
    grep -m1 'was not written' "$out/cut.log"
    grep -q 'checkpoint at step 5 was not written: .*Not a directory' "$out/cut.log" || fail "no cause in the message"
    sleep 0.5
    victim=$(ranks_of cut | tail -1)
    kill -TERM "$victim"
    wait "$launcher"; code=$?
    [ "$code" = 1 ] || fail "exit $code after a stop whose checkpoint failed, expected 1"
    n=$(grep -c '"error":' "$out/cut/report.json")
    [ "$n" -ge 2 ] || fail "report lists $n failed writes"
    grep -q '"on_signal": true' "$out/cut/report.json" || fail "the stop-signal attempt is not listed"
    ;;
  *) echo "unknown scenario $scenario"; exit 2 ;;
esac
echo "ok: $scenario"
