#!/usr/bin/env bash
# The input pipeline end to end with real ranks (issue: real input data): resume
# mid-epoch bitwise on image_folder and webdataset (with another thread count),
# bad files skipped or fatal, bad archives and arrays named, and the `data` verb.
#
# usage: data_e2e.sh MPIRUN "MPI FLAGS" BATCHDIST MODEL_DIFF MAKE_DATA CONFIG OUTDIR SCENARIO
#   resume_image_folder  rank 0 killed right after the checkpoint of step 8 (mid-epoch 2),
#   resume_webdataset    --resume auto with data.workers 2 instead of 1: bitwise equal
#   bad_files            a truncated JPEG, an empty file and text named .jpg, and one
#                        in val/ (met by evaluation): skipped (each named once, counted
#                        and named in data_errors), or exit 1 with on_error fail
#   bad_archives         a truncated tar, a sample without .cls, an .npy with a wrong magic,
#                        a fortran-order .npy, x/y length mismatch: exit 2 naming the file
#   data_verb            `batchdist data --json` on 2 ranks: samples_per_s, per_rank, workers
#   named_errors         every bad file counted is named in data_errors, whichever rank met
#                        it (Note [bad files named]); a dangling symlink and a FIFO named
#                        like images are named with their kind; symlinked folders (to .,
#                        .., ROOT, a sibling class) add no sample (Note [each file once]);
#                        a data.list entry that does not exist is named; one that leaves
#                        the root, and a wild .cls label, are refused with exit 2
set -u
mpirun=$1 flags=$2 bin=$3 diff=$4 make=$5 cfg=$6 out=$7 scenario=$8
. "$(dirname "$0")/mpi_job_lib.sh"
own_scratch_out

# run NAME NP ARGS...: one batchdist run into $out/NAME (log in $out/NAME.log); sets rc.
run() { run_into "$@"; }

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
    # Met only by evaluation: skipped there, and counted and named as training's are.
    val_bad=$(find "$out/data/val" -name '*.jpg' | sort | head -1)
    echo "text, not a JPEG either" > "$val_bad"
    run skip 2 --set data.path="$out/data" --set train.epochs=2
    [ "$rc" = 0 ] || { cat "$out/skip.log"; fail "skip: exit $rc"; }
    [ "$(json skip data_errors count)" = 4 ] || fail "data_errors.count = $(json skip data_errors count), expected 4 (3 in training, 1 in evaluation)"
    json skip data_errors first | grep -qF "$val_bad" ||
      fail "the bad file evaluation met is not named: $(json skip data_errors first)"
    json skip data_errors first | grep -qF "(met in evaluation)" ||
      fail "the bad file evaluation met is not said to be evaluation's: $(json skip data_errors first)"
    for r in 0 1; do  # each rank names a bad file the first time it meets it, once
      n=$(grep -c "rank $r/2\] warning: skipping $first" "$out/skip.log")
      [ "$n" -le 1 ] || fail "rank $r warned about $first $n times (expected at most once)"
    done
    grep -q "warning: skipping $first: JPEG: Premature end" "$out/skip.log" || fail "no warning naming $first"
    grep -q 'not a JPEG or PNG image (it is empty)' "$out/skip.log" || fail "no reason for the empty file"
    echo "ok: 4 bad files skipped (1 in evaluation), each named at most once per rank, data_errors.count = 4 (not 4 x ranks)"
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
  named_errors)
    "$make" image_folder "$out/data" >/dev/null || fail "make_data"
    d=$out/data/train
    mapfile -t classes < <(ls "$d")
    bad=()
    for c in "${classes[@]}"; do  # 2 broken JPEGs per class: 8 of the 96 samples
      for f in $(find "$d/$c" -name '*.jpg' | sort | head -2); do echo "not a JPEG" > "$f"; bad+=("$f"); done
    done
    ln -s gone.jpg "$d/${classes[0]}/dangling.jpg"
    mkfifo "$d/${classes[1]}/pipe.jpg"
    ln -s . "$d/${classes[0]}/self"
    ln -s .. "$d/${classes[1]}/up"
    ln -s ../../.. "$d/${classes[2]}/root"
    ln -s "../${classes[0]}" "$d/${classes[3]}/sibling"
    run walk 2 --set data.path="$out/data" --set train.epochs=1
    [ "$rc" = 0 ] || { cat "$out/walk.log"; fail "walk: exit $rc"; }
    [ "$(json walk data_pipeline train_samples)" = 96 ] ||
      fail "train_samples = $(json walk data_pipeline train_samples), expected 96 (a symlinked folder let files in twice)"
    # The test needs a bad file that only rank 1 met (the seeded order decides which).
    only1=0
    for f in "${bad[@]}"; do
      if grep -qF "[rank 1/2] warning: skipping $f" "$out/walk.log" &&
         ! grep -qF "[rank 0/2] warning: skipping $f" "$out/walk.log"; then only1=$((only1 + 1)); fi
    done
    [ "$only1" -gt 0 ] || { cat "$out/walk.log"; fail "setup: no bad file was met by rank 1 alone"; }
    python3 - "$out/walk/report.json" "$d/${classes[0]}/dangling.jpg" "$d/${classes[1]}/pipe.jpg" \
      "${bad[@]}" <<'PY' || fail "walk: data_errors"
import json, sys
e = json.load(open(sys.argv[1]))["data_errors"]
dangling, pipe, bad = sys.argv[2], sys.argv[3], sys.argv[4:]
named = {x["file"]: x["reason"] for x in e["first"]}
assert e["count"] == 10, e  # 8 broken JPEGs, the dangling link and the FIFO
assert len(e["first"]) == 10 and len(named) == 10, e
for f in bad: assert f in named, (f, "counted but not named", e)
assert named[dangling].startswith("dangling symlink (to gone.jpg)"), e
assert named[pipe].startswith("FIFO"), e
print("ok: data_errors names all", e["count"], "bad files (dangling symlink and FIFO with their kind)")
PY
    grep -qF "[rank 0/2] warning: data: skipping $d/${classes[0]}/dangling.jpg: dangling symlink (to gone.jpg)" "$out/walk.log" ||
      { cat "$out/walk.log"; fail "no warning naming the dangling symlink"; }
    echo "ok: $only1 bad file(s) met by rank 1 alone are named; symlinked folders added no sample"
    # data.list: an entry that does not exist is named, whichever rank meets it.
    "$make" image_folder "$out/clean" >/dev/null || fail "make_data clean"
    (cd "$out/clean" && find train -name '*.jpg' -o -name '*.png' | sort | head -95 |
       awk -F/ '{ if (!($2 in k)) k[$2] = n++; print $0, k[$2] }') > "$out/clean/list.txt"
    echo "train/missing.jpg 0" >> "$out/clean/list.txt"
    lst=(--set data.list="$out/clean/list.txt" --set data.path="$out/clean" --set data.val_fraction=0)
    run list 2 "${lst[@]}" --set train.epochs=1
    [ "$rc" = 0 ] || { cat "$out/list.log"; fail "list: exit $rc"; }
    [ "$(json list data_errors count)" = 1 ] || fail "list: data_errors.count = $(json list data_errors count), expected 1"
    json list data_errors first | grep -qF "$out/clean/train/missing.jpg" ||
      fail "list: the missing entry is counted but not named: $(json list data_errors first)"
    echo "ok: a data.list entry that does not exist is named in data_errors"
    echo "../outside.jpg 1" >> "$out/clean/list.txt"
    run outside 2 "${lst[@]}"
    expect_error outside 2 "$out/clean/list.txt:97: '../outside.jpg' leaves the data root" "data.list_outside_root: true"
    # A wild .cls label: exit 2 naming the member, not a 1,000,000-way head.
    "$make" webdataset "$out/wds" >/dev/null || fail "make_data webdataset"
    python3 - "$out/wds/train-000000.tar" "$out/wild.tar" <<'PY' || fail "wild.tar"
import io, sys, tarfile
with tarfile.open(sys.argv[1]) as src, tarfile.open(sys.argv[2], "w", format=tarfile.USTAR_FORMAT) as dst:
    done = False
    for m in src.getmembers():
        data = src.extractfile(m).read()
        if m.name.endswith(".cls") and not done:
            data, done = b"999999", True
            print(m.name)
        info = tarfile.TarInfo(m.name); info.size = len(data); dst.addfile(info, io.BytesIO(data))
PY
    run wild 2 --set data.name=webdataset --set data.path="$out/wild.tar" --set data.val_path=
    expect_error wild 2 "label 999999 in $out/wild.tar member" "-way head" "set data.classes if that is intended"
    ;;
  *) fail "unknown scenario $scenario" ;;
esac
