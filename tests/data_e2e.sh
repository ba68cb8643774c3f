#!/usr/bin/env bash
# The input pipeline end to end with real ranks (issue: real input data): resume
# mid-epoch bitwise on image_folder and webdataset (with another thread count),
# bad files skipped or fatal, bad archives and arrays named, and the `data` verb.
#
# usage: data_e2e.sh MPIRUN "MPI FLAGS" BATCHDIST MODEL_DIFF MAKE_DATA CONFIG OUTDIR SCENARIO
#   resume_image_folder  rank 0 killed right after the checkpoint of step 8 (mid-epoch 2),
#   resume_webdataset    --resume auto with data.workers 2 instead of 1: bitwise equal
#   bad_files            a truncated JPEG, an empty file and text named .jpg: skipped
#                        (each named once, counted in data_errors), or exit 1 with on_error fail
#   bad_archives         a truncated tar, a sample without .cls, an .npy with a wrong magic,
#                        a fortran-order .npy, x/y length mismatch: exit 2 naming the file
#   data_verb            `batchdist data --json` on 2 ranks: samples_per_s, per_rank, workers
set -u
mpirun=$1 flags=$2 bin=$3 diff=$4 make=$5 cfg=$6 out=$7 scenario=$8
rm -rf "$out"; mkdir -p "$out"
. "$(dirname "$0")/mpi_job_lib.sh"

# run NAME NP ARGS...: one batchdist run into $out/NAME (log in $out/NAME.log); sets rc.
run() { run_into "$@"; }
json() {  # json RUN KEY...: a value of RUN's report.json
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
for k in sys.argv[2:]: d = d[k]
print(d)' "$out/$1/report.json" "${@:2}"
}
expect_error() {  # expect_error NAME CODE TEXT...: exit CODE, and each TEXT in the log
  local name=$1 code=$2; shift 2
  [ "$rc" = "$code" ] || { cat "$out/$name.log"; fail "$name: exit $rc, expected $code"; }
  for text in "$@"; do
    grep -qF -- "$text" "$out/$name.log" || { cat "$out/$name.log"; fail "$name: no '$text' in the log"; }
  done
  echo "ok: $name: exit $code, names: $*"
}

case "$scenario" in
  resume_image_folder|resume_webdataset)
    if [ "$scenario" = resume_image_folder ]; then
      "$make" image_folder "$out/data" >/dev/null || fail "make_data"
      src=(--set data.path="$out/data")
    else
      "$make" webdataset "$out/data" >/dev/null || fail "make_data"
      src=(--set data.name=webdataset --set "data.path=$out/data/train-{000000..000002}.tar"
           --set data.val_path="$out/data/val-000000.tar")
    fi
    # 96 samples, global 16: 6 steps per epoch; dropout, so the RNG must be restored too.
    base=("${src[@]}" --set train.epochs=3 --set model.dropout=0.1 --set checkpoint.every_steps=4
          --set checkpoint.every_minutes=0 --set data.workers=1)
    run full 2 "${base[@]}"; [ "$rc" = 0 ] || { cat "$out/full.log"; fail "uninterrupted run: exit $rc"; }
    BATCHDIST_FAULT_CHECKPOINT=after_rename BATCHDIST_FAULT_CHECKPOINT_STEP=8 run cut 2 "${base[@]}"
    [ "$rc" != 0 ] || fail "the cut run was not killed"
    [ ! -f "$out/cut/report.json" ] || fail "the cut run finished"
    run cut 2 "${base[@]}" --set data.workers=2 --resume auto
    [ "$rc" = 0 ] || { cat "$out/cut.log"; fail "resumed run: exit $rc"; }
    grep -q 'resume: .*step 8' "$out/cut.log" || { cat "$out/cut.log"; fail "did not resume from step 8"; }
    [ "$(json cut steps)" = "$(json full steps)" ] || fail "steps differ"
    [ "$(json cut samples)" = "$(json full samples)" ] || fail "samples counted twice or lost"
    "$diff" "$out/full/model.pt" "$out/cut/model.pt" 0 || fail "resumed model differs from the uninterrupted one"
    echo "ok: resumed at step 8 of 18 (mid-epoch 2) with 2 threads instead of 1: bitwise equal"
    ;;
  bad_files)
    "$make" image_folder "$out/data" >/dev/null || fail "make_data"
    d=$out/data/train
    first=$(find "$d/c1_dog" -name '*.jpg' | sort | head -1)
    head -c 300 "$first" > "$out/t" && mv "$out/t" "$first"                  # truncated
    : > "$(find "$d/c2_bird" -name '*.jpg' | sort | head -1)"                 # empty
    echo "hello, not a JPEG" > "$(find "$d/c3_fish" -name '*.jpg' | sort | head -1)"  # text
    run skip 2 --set data.path="$out/data" --set train.epochs=2
    [ "$rc" = 0 ] || { cat "$out/skip.log"; fail "skip: exit $rc"; }
    [ "$(json skip data_errors count)" = 3 ] || fail "data_errors.count = $(json skip data_errors count), expected 3"
    for r in 0 1; do  # each rank names a bad file the first time it meets it, once
      n=$(grep -c "rank $r/2\] warning: skipping $first" "$out/skip.log")
      [ "$n" -le 1 ] || fail "rank $r warned about $first $n times (expected at most once)"
    done
    grep -q "warning: skipping $first: JPEG: Premature end" "$out/skip.log" || fail "no warning naming $first"
    grep -q 'not a JPEG or PNG image (it is empty)' "$out/skip.log" || fail "no reason for the empty file"
    echo "ok: 3 bad files skipped, each named at most once per rank, data_errors.count = 3 (not 3 x ranks)"
    run fail 2 --set data.path="$out/data" --set data.on_error=fail
    expect_error fail 1 "$(basename "$first")" "on_error"
    ;;
  bad_archives)
    "$make" webdataset "$out/wds" >/dev/null || fail "make_data"
    wds=(--set data.name=webdataset --set data.val_path=)
    head -c 5000 "$out/wds/train-000001.tar" > "$out/cut.tar"
    run tar_cut 2 "${wds[@]}" --set data.path="$out/cut.tar"
    expect_error tar_cut 2 "cut.tar" "truncated"
    python3 - "$out/nocls.tar" <<'PY'
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w", format=tarfile.USTAR_FORMAT) as t:
    for name, data in [("a.jpg", b"\xff\xd8\xff"), ("a.cls", b"1"), ("b.jpg", b"\xff\xd8\xff")]:
        info = tarfile.TarInfo(name); info.size = len(data); t.addfile(info, io.BytesIO(data))
PY
    run tar_nocls 2 "${wds[@]}" --set data.path="$out/nocls.tar"
    expect_error tar_nocls 2 "nocls.tar" "cls"
    "$make" npy "$out/npy" >/dev/null || fail "make_data npy"
    np=(--set data.name=npy --set data.path="$out/npy")
    cp "$out/npy/x.npy" "$out/x.good"
    printf 'NOTNUMPY' | dd of="$out/npy/x.npy" conv=notrunc 2>/dev/null
    run npy_magic 2 "${np[@]}"
    expect_error npy_magic 2 "x.npy" "magic"
    python3 -c "
import sys; b=open('$out/x.good','rb').read(); b=b.replace(b\"'fortran_order': False\", b\"'fortran_order': True \"); open('$out/npy/x.npy','wb').write(b)"
    run npy_fortran 2 "${np[@]}"
    expect_error npy_fortran 2 "x.npy" "fortran"
    cp "$out/x.good" "$out/npy/x.npy"
    "$make" npy "$out/npy2" --samples 100 >/dev/null && cp "$out/npy2/y.npy" "$out/npy/y.npy"
    run npy_len 2 "${np[@]}"
    expect_error npy_len 2 "100 labels for 120 samples"
    ;;
  data_verb)
    "$make" image_folder "$out/data" >/dev/null || fail "make_data"
    # shellcheck disable=SC2086
    "$mpirun" $flags -np 2 "$bin" data "$cfg" --set data.path="$out/data" --set data.workers=1 \
      --seconds 1 --json --output "$out/verb" >"$out/verb.json" 2>"$out/verb.err" || { cat "$out/verb.err"; fail "data verb: exit $?"; }
    python3 - "$out/verb.json" <<'PY' || fail "data verb JSON"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["samples_per_s"] > 0, d
assert len(d["per_rank"]) == 2 and [r["rank"] for r in d["per_rank"]] == [0, 1], d["per_rank"]
assert abs(sum(r["samples_per_s"] for r in d["per_rank"]) - d["samples_per_s"]) < 1e-6 * d["samples_per_s"]
assert d["workers"] == 1 and d["source"] == "image_folder" and d["samples"] == 96 and d["classes"] == 4
for r in d["per_rank"]:
    assert r["decode_s"] > 0 and r["bytes"] > 0 and r["batches"] > 0, r
print("ok: data verb:", round(d["samples_per_s"]), "samples/s over 2 ranks")
PY
    ;;
  *) fail "unknown scenario $scenario" ;;
esac
