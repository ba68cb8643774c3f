#!/usr/bin/env bash
# Tasks end to end with real ranks (Note [task], Note [task choice]).
#
# usage: task_e2e.sh MPIRUN "MPI FLAGS" BATCHDIST MODEL_DIFF MAKE_DATA SRC_DIR OUTDIR SCENARIO
#   regression   float targets (y.npy N x 3) on 2 ranks with a padded last batch:
#                task.name auto picks regression; the mse falls; eval_mse and eval_mae
#                in report.json (and its history), metrics.jsonl, report.html,
#                TensorBoard and the closing line, no eval_accuracy anywhere; rank 0
#                killed after the checkpoint of step 8 and resumed: bitwise equal
#   task_errors  task.name regression on class labels, classification on float
#                targets, model.outputs that is not the targets' k, token data with
#                a model that is not gpt, a gpt on other data: exit 2, named
#   language_model  byte-level tokens of README.md (batchdist_make_data tokens),
#                configs/gpt-tiny.yaml on 2 ranks for 4 epochs: task.name auto picks
#                language_model; eval_loss below a bound set from measurement,
#                eval_perplexity its exp in report.json (and its history),
#                metrics.jsonl, TensorBoard and the closing line; the batch given as
#                batch.global_tokens 2070 (32.34 windows of 64: global batch 32, said
#                by the plan) with the per-GPU batch searched: tokens/s and tokens per
#                step (Note [tokens per sample]) in the plan, the search's lines,
#                table and why, the progress, epoch and closing lines, report.json
#                (top level, history, plan, search, noise scale), metrics.jsonl,
#                search.json, report.html (summary, chart axes), TensorBoard (train
#                and search), the noise-scale line and diagnosis, and `batchdist data
#                --json`, each = samples x 64; then, with the config's batch, rank 0
#                killed after the checkpoint of step 12 (mid epoch 2) and resumed:
#                bitwise equal to an uninterrupted run, the same metrics and history
#   lm_levers    the GPT with the memory levers together (issue 36 §1): gpt-tiny on 2
#                ranks under bf16 autocast, batch.adapt: goodput (re-decided every 4
#                steps, in the warmup too), rank 1 out of memory at step 5
#                (BATCHDIST_FAULT_OOM=1:5): the back-off 16x1 -> 8x2 in report.json,
#                the adaptive run reaches the plan's G0-equivalent steps, and the loss
#                falls below the language_model scenario's bound
#   token_errors every bad token file through the launcher, exit 2 and named (Note
#                [tokens]): a token id >= model.vocab (the file, the token's offset
#                and its value, checked against the file), an odd-sized .bin, a file
#                one token shorter than a window, an empty file, a directory, a .npy
#                of an unsupported dtype, and a bad data.val_path named as such
#   module_loss  tests/data/regression_loss.pt, a TorchScript module whose forward(x,
#                target) returns a dict {"loss": [N], "mae": scalar} (Note [module
#                loss]), on y.npy N x 3 with a padded last batch: task.name auto picks
#                module_loss on 2 ranks; the loss falls; eval_mae in report.json (and
#                its history), metrics.jsonl, TensorBoard and the closing line; the same
#                targets as y.npy N x 1 x 3 train to the same loss; 3 ranks train it
#                too; tests/data/mean_loss.pt (a 0-d mean) is refused with
#                padding (exit 2, the message) and trains without; a one-input module
#                with task.name: module_loss: exit 2, named
#   module_lm    tests/data/lm_loss.pt, a byte-level bigram module returning a tuple
#                (per-window mean token cross-entropy [N], token accuracy), on tokens
#                of README.md on 2 ranks: module_loss; the loss falls below a bound
#                set from a measurement; eval_metric_1 in report.json and TensorBoard
set -u
mpirun=$1 flags=$2 bin=$3 diff=$4 make=$5 src=$6 out=$7 scenario=$8
cfg=$src/configs/regression-tiny.yaml
. "$(dirname "$0")/mpi_job_lib.sh"
own_scratch_out

run() { run_into "$@"; }

# Note [tokens per sample]: the language-model run `lm` shows tokens beside samples
# wherever it shows a rate or a batch; then the `data` verb on the same tokens.
lm_tokens() {
  local log=$out/lm.log line
  for line in \
    '  tokens: batch.global_tokens 2070 = 32.34 windows of 64 tokens (model.seq_len), rounded down to whole windows: global batch 32 (2048 tokens per step)' \
    'objective throughput, per-GPU from 8 dividing 16 (batch.global 32 = 2048 tokens)' \
    '     tokens/s   95 % interval' \
    'the chosen global batch 32 is 2048 tokens per step'; do
    grep -qF -- "$line" "$log" || { cat "$log"; fail "no '$line' in the run's output"; }
  done
  # (A candidate's interval is left out when two slow steps gave none: Note [adaptive timing].)
  for re in '^  per-GPU (8|16) x accum [12]: [0-9]+ samples/s \(([0-9.]+\.\.[0-9.]+, )?[0-9]+ steps\), [0-9]+ tokens/s, peak' \
            '^  chosen per-GPU batch (8|16) x accum [12]: the (highest|smallest) .*[0-9]+ samples/s, [0-9]+ tokens/s' \
            '^epoch 1/4 step [0-9]+/[0-9]+ .* [0-9]+ samples/s \([0-9]+ tokens/s\)  MFU [0-9.]+ %  data ' \
            '^epoch 4/4  train_loss .* [0-9]+ samples/s \([0-9]+ tokens/s\)  \(' \
            '^mfu: [0-9.e+-]+ GFLOP a sample \(forward and backward\), peak [0-9.e+-]+ TFLOP/s a device \(measured: a fp32 GEMM' \
            '^done: .* [0-9]+ samples/s \([0-9]+ tokens/s\), MFU [0-9.]+ %, '; do
    grep -qE -- "$re" "$log" || { cat "$log"; fail "no line matching '$re' in the run's output"; }
  done
  python3 - "$out/lm" "$log" <<'PY' || fail "tokens in the language model's records (above)"
import json, math, re, sys
run, log = sys.argv[1], open(sys.argv[2]).read()
r = json.load(open(run + "/report.json"))
close = lambda a, b: math.isclose(a, b, rel_tol=1e-9)
assert r["global_batch"] == 32 and r["tokens_per_step"] == 32 * 64, (r["global_batch"], r.get("tokens_per_step"))
assert close(r["tokens_per_s"], 64 * r["samples_per_s"]) and r["tokens"] == 64 * r["samples"], r
p = r["plan"]
assert (p["tokens_per_sample"], p["tokens_per_step"], p["global_tokens_asked"]) == (64, 2048, 2070), p
assert all(close(h["tokens_per_s"], 64 * h["samples_per_s"]) for h in r["history"]), r["history"]
assert close(r["search"]["chosen_tokens_per_s"], 64 * r["search"]["chosen_samples_per_s"]), r["search"]
assert (r["config"]["batch"]["global"], r["config"]["batch"]["global_tokens"]) == (32, 2070), r["config"]["batch"]
lines = [json.loads(l) for l in open(run + "/metrics.jsonl")]
assert lines and all(close(m["tokens_per_s"], 64 * m["samples_per_s"]) and
                     m["tokens_per_step"] == 64 * m["global_batch"] for m in lines), lines[0]
s = json.load(open(run + "/search.json"))
assert s["tokens_per_sample"] == 64 and all(
    close(c["tokens_per_s"], 64 * c["samples_per_s"]) for c in s["candidates"]), s
html = open(run + "/report.html").read()
assert " tokens/s, 2048 tokens per step)" in html and "tokens_per_step" in html, "report.html"
# The charts' rate axes in tokens/s (the training throughput, the search).
assert ">tokens/s</text>" in html and ">tokens/s (all ranks)</text>" in html, "report.html's charts"
# The gradient noise scale in tokens: report.json, the closing line, the diagnosis.
n = r["noise_scale"]
assert n["global_batch_tokens"] == 64 * n["global_batch"], n
if n["b_simple"] is not None:
    assert close(n["b_simple_tokens"], 64 * n["b_simple"]), n
    line = re.search(r"^gradient noise scale: B_simple ~ [0-9.e+-]+ samples \(([0-9.e+-]+) tokens, "
                     r"smoothed\), global batch 32 \(2048 tokens\)$", log, re.M)
    assert line, "no closing noise-scale line in tokens"
    assert math.isclose(float(line.group(1)), 64 * n["b_simple"], rel_tol=0.05, abs_tol=0.5), line.group(0)
else:
    assert n["b_simple_tokens"] is None and "gradient noise scale:" not in log, n
found = [d for d in r.get("diagnosis", []) if d.startswith("noise scale:")]
assert all("global batch 32 (2048 tokens)" in d for d in found), found
print(f"ok: {r['samples_per_s']:.0f} samples/s = {r['tokens_per_s']:.0f} tokens/s, 2048 tokens a step;"
      f" B_simple {n['b_simple']} = {n['b_simple_tokens']} tokens; {len(found)} noise finding(s)")
PY
  for tag in train/tokens_per_s batch/global_tokens train/epoch_tokens_per_s; do
    grep -aqr "$tag" "$out/lm/tensorboard/train" || fail "no $tag in the TensorBoard events"
  done
  grep -aqr 'search/tokens_per_s' "$out/lm/tensorboard/search" || fail "no search/tokens_per_s in the TensorBoard events"
  # shellcheck disable=SC2086
  "$mpirun" $flags -np 2 "$bin" data "$cfg" "${tok[@]}" --seconds 0.3 --json --output "$out/data" \
    >"$out/data.json" 2>"$out/data.log"
  rc=$?
  [ "$rc" = 0 ] || { cat "$out/data.log"; fail "batchdist data: exit $rc"; }
  python3 - "$out/data.json" <<'PY' || fail "tokens in \`batchdist data --json\` (above)"
import json, math, sys
d = json.load(open(sys.argv[1]))
assert d["tokens_per_sample"] == 64 and d["samples_per_s"] > 0, d
assert math.isclose(d["tokens_per_s"], 64 * d["samples_per_s"], rel_tol=1e-9), d
assert all(math.isclose(r["tokens_per_s"], 64 * r["samples_per_s"], rel_tol=1e-9) for r in d["per_rank"]), d
print(f"ok: data verb {d['tokens_per_s']:.0f} tokens/s over 2 ranks")
PY
}

"$make" npy "$out/reg" --dtype float32 --shape 24 --targets 3 --val 40 >/dev/null || fail "make_data npy --targets"

case "$scenario" in
  regression)
    # 120 samples, global 16: 7.5 steps per epoch, padded to 8 (Note [equal shards]).
    base=(--set data.path="$out/reg" --set checkpoint.every_steps=4 --set checkpoint.every_minutes=0)
    run full 2 "${base[@]}"; [ "$rc" = 0 ] || { cat "$out/full.log"; fail "regression run: exit $rc"; }
    grep -q 'task: regression (task.name: auto; npy has float targets), 3 outputs' "$out/full.log" \
      || { cat "$out/full.log"; fail "the console does not say which task and why"; }
    ! grep -q 'tokens' "$out/full.log" || { cat "$out/full.log"; fail "a run on npy speaks of tokens"; }
    [ "$(json full task)" = regression ] || fail "report.json task = $(json full task)"
    [ "$(json full best_metric)" = mse ] || fail "report.json best_metric = $(json full best_metric)"
    [ "$(json full plan samples_padded)" -gt 0 ] || fail "no padded samples: the test needs a padded last batch"
    python3 - "$out/full" <<'PY' || fail "the regression metrics (above)"
import json, sys
run = sys.argv[1]
r = json.load(open(run + "/report.json"))
assert "eval_accuracy" not in r, "report.json has eval_accuracy"
first, last = r["history"][0], r["history"][-1]
for h in (first, last):
    assert {"eval_mse", "eval_mae"} <= set(h) and "eval_accuracy" not in h, h
assert r["eval_mse"] == last["eval_mse"] and r["eval_mae"] == last["eval_mae"], (r["eval_mse"], last)
assert last["eval_mse"] < first["eval_mse"] / 2, f"the mse did not fall: {first['eval_mse']} -> {last['eval_mse']}"
assert abs(r["eval_loss"] - r["eval_mse"]) < 1e-9, "eval_loss is the mse"
ends = [m for m in map(json.loads, open(run + "/metrics.jsonl")) if m["kind"] == "epoch"]
assert len(ends) == len(r["history"]), f"{len(ends)} epoch-end lines in metrics.jsonl"
assert all("eval_mse" in e and "eval_mae" in e and "eval_accuracy" not in e for e in ends), ends[-1]
html = open(run + "/report.html").read()
assert 'id="plot-mse"' in html and "held-out mse" in html, "report.html has no mse chart"
# Note [tokens per sample]: samples that are not tokens show no tokens anywhere.
assert not [k for k in list(r) + list(r["plan"]) + list(ends[-1]) if k.startswith("tokens")], r
assert "tokens/s" not in html, "report.html speaks of tokens"
assert "eval mse " in html and "plot-accuracy" not in html, "report.html speaks of accuracy"
print(f"ok: eval mse {first['eval_mse']:.4g} -> {last['eval_mse']:.4g}, mae {last['eval_mae']:.4g}")
PY
    grep -aqr 'eval/mse' "$out/full/tensorboard" && grep -aqr 'eval/mae' "$out/full/tensorboard" \
      || fail "no eval/mse and eval/mae in the TensorBoard events"
    ! grep -aqr 'eval/accuracy' "$out/full/tensorboard" || fail "eval/accuracy in the TensorBoard events"
    grep -q '^done: .*eval mse [0-9.e-]*, eval mae [0-9.e-]*,' "$out/full.log" \
      || { tail -n 3 "$out/full.log"; fail "the closing line does not give the mse and mae"; }
    BATCHDIST_FAULT_CHECKPOINT=after_rename BATCHDIST_FAULT_CHECKPOINT_STEP=8 run cut 2 "${base[@]}"
    [ "$rc" != 0 ] || fail "the cut run was not killed"
    run cut 2 "${base[@]}" --resume auto
    [ "$rc" = 0 ] || { cat "$out/cut.log"; fail "resumed run: exit $rc"; }
    grep -q 'resume: .*step 8' "$out/cut.log" || { cat "$out/cut.log"; fail "did not resume from step 8"; }
    "$diff" "$out/full/model.pt" "$out/cut/model.pt" 0 || fail "resumed model differs from the uninterrupted one"
    [ "$(json cut eval_mse)" = "$(json full eval_mse)" ] || fail "resumed eval_mse $(json cut eval_mse) != $(json full eval_mse)"
    [ "$(json cut history 0 eval_mse)" = "$(json full history 0 eval_mse)" ] \
      || fail "the resumed run's history (from the checkpoint) differs"
    echo "ok: regression resumed at step 8 of 48: bitwise equal, the same metrics and history"
    ;;
  task_errors)
    "$make" npy "$out/cls" --shape 24 >/dev/null || fail "make_data npy"
    run labels 2 --set data.path="$out/cls" --set task.name=regression
    expect_error labels 2 "task.name: regression needs float targets, but data.name npy gives class labels"
    run floats 2 --set data.path="$out/reg" --set task.name=classification
    expect_error floats 2 "task.name: classification needs integer class labels, but npy's y.npy holds floats"
    run outputs 2 --set data.path="$out/reg" --set model.outputs=2
    expect_error outputs 2 "model.outputs: 2, but the targets have 3 values per sample"
    run unknown 2 --set data.path="$out/reg" --set task.name=ranking
    expect_error unknown 2 "task.name" "ranking"
    # Note [task choice]: token data, the gpt and the language model go together.
    run tokens_mlp 2 --set data.name=tokens --set data.path="$out/none.bin"
    expect_error tokens_mlp 2 "model.name: mlp, but data.name: tokens gives token ids, which only model.name: gpt reads"
    run gpt_npy 2 --set data.path="$out/reg" --set model.name=gpt
    expect_error gpt_npy 2 "data.name: npy, but model.name: gpt reads token ids"
    echo "ok: a task that does not fit the data, a head that does not fit the targets: exit 2, named"
    ;;
  language_model)
    cfg=$src/configs/gpt-tiny.yaml
    "$make" tokens --text "$src/README.md" --out "$out/tok" --val-fraction 0.1 >/dev/null \
      || fail "make_data tokens"
    python3 - "$src/README.md" "$out/tok" <<'PY' || fail "the token files are not the text's bytes as uint16"
import struct, sys
text = open(sys.argv[1], "rb").read()
train, val = (open(f"{sys.argv[2]}/{name}", "rb").read() for name in ("train.bin", "val.bin"))
assert abs(len(val) // 2 - len(text) * 0.1) <= 1, f"val.bin has {len(val) // 2} of {len(text)} tokens"
assert train + val == b"".join(struct.pack("<H", b) for b in text), "not the bytes as uint16 ids"
PY
    tok=(--set data.path="$out/tok/train.bin" --set data.val_path="$out/tok/val.bin")
    # Note [global tokens]: 2070 tokens = 32.34 windows of 64, so the same global
    # batch 32 as the config's; the per-GPU batch (8 or 16) searched, briefly.
    search=(--set batch.per_gpu=auto --set search.max=16 --set search.rounds=0
            --set search.min_time_s=0.05 --set search.max_time_s=0.2)
    run lm 2 "${tok[@]}" --set train.epochs=4 --set batch.global=null \
      --set batch.global_tokens=2070 "${search[@]}" --set train.progress=lines
    [ "$rc" = 0 ] || { cat "$out/lm.log"; fail "language-model run: exit $rc"; }
    grep -q 'task: language_model (task.name: auto; tokens are token windows), 256 outputs' "$out/lm.log" \
      || { cat "$out/lm.log"; fail "the console does not say which task and why"; }
    [ "$(json lm task)" = language_model ] || fail "report.json task = $(json lm task)"
    [ "$(json lm best_metric)" = loss ] || fail "report.json best_metric = $(json lm best_metric)"
    python3 - "$out/lm" <<'PY' || fail "the language-model metrics (above)"
import json, math, sys
run = sys.argv[1]
r = json.load(open(run + "/report.json"))
loss, ppl = r["eval_loss"], r["eval_perplexity"]
assert math.isfinite(loss) and math.isfinite(ppl), (loss, ppl)
assert abs(ppl - math.exp(loss)) <= 1e-9 * ppl, f"perplexity {ppl} is not exp(eval_loss {loss})"
assert r["best_higher"] is False and "eval_accuracy" not in r, r.get("eval_accuracy")
hist = r["history"]
assert len(hist) == 4 and all({"eval_loss", "eval_perplexity"} <= set(h) for h in hist), hist
# The bound, from measurement (this run, 2 ranks, Debian's LibTorch 1.13, train.seed
# 1..10): the last eval_loss was 3.892..3.952 (seed 1, the config's: 3.935; standard
# deviation 0.018) on README.md before docs/models.md's row was added to it, and
# 3.906..3.964 after (3.954): a README edit moves the held-out text. The bound is the
# max seen plus 0.14 (~7 deviations), room for more edits and LibTorch 2.x's kernels.
# Half as much training (epoch 2: 4.26..4.35) or none (ln 256 = 5.545) fails.
bound = 4.10
assert loss < bound, f"eval_loss {loss}: not below {bound} (measured: 3.89..3.96)"
assert hist[-1]["eval_loss"] < hist[0]["eval_loss"], f"the loss did not fall: {hist}"
ends = [m for m in map(json.loads, open(run + "/metrics.jsonl")) if m["kind"] == "epoch"]
assert len(ends) == 4 and all("eval_perplexity" in e for e in ends), ends[-1]
html = open(run + "/report.html").read()
assert "eval loss " in html and "plot-accuracy" not in html, "report.html speaks of accuracy"
print(f"ok: eval loss {hist[0]['eval_loss']:.4g} -> {loss:.4g}, perplexity {ppl:.4g}")
PY
    grep -aqr 'eval/perplexity' "$out/lm/tensorboard" || fail "no eval/perplexity in the TensorBoard events"
    grep -q '^done: .*eval loss [0-9.e+-]*, perplexity [0-9.e+-]*,' "$out/lm.log" \
      || { tail -n 3 "$out/lm.log"; fail "the closing line does not give the loss and perplexity"; }
    lm_tokens
    # Note [checkpoint]: the config's batch (global 32, per-GPU 16), ~300 windows of README.md:
    # about 10 steps per epoch (README.md's length decides), 4 epochs; a checkpoint every 4.
    base=("${tok[@]}" --set train.epochs=4 --set checkpoint.every_steps=4 --set checkpoint.every_minutes=0)
    run full 2 "${base[@]}"
    [ "$rc" = 0 ] || { cat "$out/full.log"; fail "uninterrupted run: exit $rc"; }
    BATCHDIST_FAULT_CHECKPOINT=after_rename BATCHDIST_FAULT_CHECKPOINT_STEP=12 run cut 2 "${base[@]}"
    [ "$rc" != 0 ] || fail "the cut run was not killed"
    run cut 2 "${base[@]}" --resume auto
    [ "$rc" = 0 ] || { cat "$out/cut.log"; fail "resumed run: exit $rc"; }
    grep -q 'resume: .*step 12' "$out/cut.log" || { cat "$out/cut.log"; fail "did not resume from step 12"; }
    "$diff" "$out/full/model.pt" "$out/cut/model.pt" 0 || fail "resumed model differs from the uninterrupted one"
    for key in eval_loss eval_perplexity; do
      [ "$(json cut $key)" = "$(json full $key)" ] || fail "resumed $key $(json cut $key) != $(json full $key)"
    done
    [ "$(json cut history 0 eval_loss)" = "$(json full history 0 eval_loss)" ] \
      || fail "the resumed run's history (from the checkpoint) differs"
    echo "ok: a byte-level GPT trained on 2 ranks as a language model; resumed at step 12: bitwise equal"
    ;;
  lm_levers)
    cfg=$src/configs/gpt-tiny.yaml
    "$make" tokens --text "$src/README.md" --out "$out/tok" --val-fraction 0.1 >/dev/null \
      || fail "make_data tokens"
    BATCHDIST_FAULT_OOM=1:5 run lev 2 --set data.path="$out/tok/train.bin" \
      --set data.val_path="$out/tok/val.bin" --set train.epochs=4 --set train.precision=bf16 \
      --set batch.per_gpu=16 --set batch.adapt=goodput --set batch.adapt_in_warmup=true \
      --set batch.adapt_every_steps=4 --set batch.adapt_min_steps=2
    [ "$rc" = 0 ] || { cat "$out/lev.log"; fail "bf16 + goodput + a back-off: exit $rc"; }
    grep -q '^model: gpt .*, precision bf16, optimizer step per_tensor$' "$out/lev.log" || { cat "$out/lev.log"; fail "not under bf16"; }
    grep -q '^oom back-off: out of memory at step 5 on rank 1 .* per-GPU batch 8 x accumulation 2' "$out/lev.log" \
      || { cat "$out/lev.log"; fail "no back-off line"; }
    python3 - "$out/lev" <<'PY' || fail "the GPT under bf16, goodput and a back-off (above)"
import json, math, sys
r = json.load(open(sys.argv[1] + "/report.json"))
b = r["oom_backoffs"]
assert len(b) == 1 and (b[0]["step"], b[0]["from"], b[0]["to"]) == (5, "16x1", "8x2"), b
# The budget is the plan's (epochs x steps per epoch; README.md's length sets the
# latter: 36 steps before this session's README rows, 40 after), in G0-equivalent steps.
total = r["plan"]["total_steps"]
assert total == 4 * r["plan"]["steps_per_epoch"], r["plan"]
assert r["batch_history"][0]["why"] == "start at G0" and r["progress"] == total, (r["batch_history"], r["progress"], total)
hist = [h["eval_loss"] for h in r["history"]]
# Measured once: 4.98, 4.32, 4.00, 3.92 (LibTorch 1.13); the bound is the
# language_model scenario's (set from 10 seeds of fp32).
assert all(map(math.isfinite, hist)) and hist[-1] < hist[0] and hist[-1] < 4.10, hist
print(f"ok: bf16 + goodput + back-off at step 5: eval loss {hist[0]:.3f} -> {hist[-1]:.3f}")
PY
    ;;
  token_errors)
    cfg=$src/configs/gpt-tiny.yaml
    "$make" tokens --text "$src/README.md" --out "$out/tok" --val-fraction 0.1 >/dev/null \
      || fail "make_data tokens"
    val=(--set data.val_path="$out/tok/val.bin")
    expected="expected token ids: a .bin of little-endian uint16, or a 1-D .npy of uint16, int32 or int64"
    # Note [tokens]: bytes of the text are ids >= 64; named when the first batch gathers them.
    run vocab 2 --set data.path="$out/tok/train.bin" "${val[@]}" --set model.vocab=64
    expect_error vocab 2 "$out/tok/train.bin: token " ", outside model.vocab's 0..63; raise model.vocab"
    python3 - "$out/vocab.log" "$out/tok/train.bin" <<'PY' || fail "vocab: the token named is not the file's"
import re, struct, sys
log, path = open(sys.argv[1]).read(), sys.argv[2]
m = re.search(re.escape(path) + r": token (\d+) \(byte offset (\d+)\) is (\d+), outside", log)
assert m, "no 'FILE: token N (byte offset B) is V, outside' in the log"
token, offset, value = map(int, m.groups())
assert offset == 2 * token, f"token {token} of a uint16 file is not at byte offset {offset}"
held = struct.unpack_from("<H", open(path, "rb").read(), offset)[0]
assert held == value and value >= 64, f"the file holds {held} at byte {offset}; the message says {value}"
print(f"ok: vocab: token {token} (byte {offset}) is {value}, as the file holds")
PY
    head -c 1001 "$src/README.md" >"$out/odd.bin"
    run odd 2 --set data.path="$out/odd.bin" "${val[@]}"
    expect_error odd 2 "$out/odd.bin: 1001 bytes is not a whole number of 2-byte tokens"
    head -c 128 "$src/README.md" >"$out/short.bin"  # 64 tokens: one short of a window of 64 + 1
    run short 2 --set data.path="$out/short.bin" "${val[@]}"
    expect_error short 2 "$out/short.bin: 64 tokens, fewer than one sample's window of model.seq_len + 1 = 65 tokens"
    : >"$out/empty.bin"
    run empty 2 --set data.path="$out/empty.bin" "${val[@]}"
    expect_error empty 2 "$out/empty.bin: empty file (check data.path; $expected)"
    mkdir "$out/folder.bin"
    run folder 2 --set data.path="$out/folder.bin" "${val[@]}"
    expect_error folder 2 "$out/folder.bin: is a directory, not a regular file (check data.path; $expected)"
    "$make" npy "$out/f16" --dtype float16 --shape 48 >/dev/null || fail "make_data npy"
    run dtype 2 --set data.path="$out/f16/x.npy" "${val[@]}"
    expect_error dtype 2 "$out/f16/x.npy: dtype float16 ('<f2') is not accepted here; expected one of uint16, int32, int64"
    run val_path 2 --set data.path="$out/tok/train.bin" --set data.val_path="$out/empty.bin"
    expect_error val_path 2 "$out/empty.bin: empty file (check data.val_path; $expected)"
    echo "ok: every bad token file: exit 2, named"
    ;;
  module_loss)
    # 120 samples, global 16: a padded last batch (Note [equal shards]).
    own=(--set model.name=torchscript --set data.path="$out/reg")
    reg=$src/tests/data/regression_loss.pt mean=$src/tests/data/mean_loss.pt
    run own 2 "${own[@]}" --set model.path="$reg"
    [ "$rc" = 0 ] || { cat "$out/own.log"; fail "module_loss run: exit $rc"; }
    grep -qF "task: module_loss (task.name: auto; $reg's forward takes (x, target))" "$out/own.log" \
      || { cat "$out/own.log"; fail "the console does not say which task and why"; }
    [ "$(json own task)" = module_loss ] || fail "report.json task = $(json own task)"
    [ "$(json own best_metric)" = loss ] || fail "report.json best_metric = $(json own best_metric)"
    [ "$(json own plan samples_padded)" -gt 0 ] || fail "no padded samples: the test needs a padded last batch"
    python3 - "$out/own" <<'PY' || fail "the module's loss and metric (above)"
import json, sys
run = sys.argv[1]
r = json.load(open(run + "/report.json"))
assert "eval_accuracy" not in r and "eval_mse" not in r, sorted(r)
first, last = r["history"][0], r["history"][-1]
assert all({"eval_loss", "eval_mae"} <= set(h) for h in r["history"]), r["history"]
assert r["eval_mae"] == last["eval_mae"] and r["eval_loss"] == last["eval_loss"], (r["eval_mae"], last)
assert last["eval_loss"] < first["eval_loss"] / 2, f"the loss did not fall: {first['eval_loss']} -> {last['eval_loss']}"
assert last["train_loss"] < first["train_loss"], (first["train_loss"], last["train_loss"])
ends = [m for m in map(json.loads, open(run + "/metrics.jsonl")) if m["kind"] == "epoch"]
assert len(ends) == len(r["history"]), f"{len(ends)} epoch-end lines in metrics.jsonl"
assert all("eval_mae" in e and "eval_loss" in e for e in ends), ends[-1]
print(f"ok: eval loss {first['eval_loss']:.4g} -> {last['eval_loss']:.4g}, mae {last['eval_mae']:.4g}")
PY
    grep -aqr 'eval/mae' "$out/own/tensorboard" || fail "no eval/mae in the TensorBoard events"
    grep -q '^done: .*eval loss [0-9.e-]*, mae [0-9.e-]*,' "$out/own.log" \
      || { tail -n 3 "$out/own.log"; fail "the closing line does not give the loss and the mae"; }
    # Note [module loss]: npy targets of any shape pass as they are: the same values
    # as N x 1 x 3 (only the header differs) train to the same loss.
    mkdir -p "$out/reg3" && cp "$out/reg/x.npy" "$out/reg/val_x.npy" "$out/reg3/" || fail "cp"
    python3 - "$out/reg" "$out/reg3" <<'PY' || fail "could not write y.npy of N x 1 x 3"
import struct, sys
for name in ("y.npy", "val_y.npy"):
    raw = open(f"{sys.argv[1]}/{name}", "rb").read()
    n = struct.unpack("<H", raw[8:10])[0]
    header = raw[10:10 + n].decode().rstrip()
    assert header.count(", 3)") == 1, header
    header = header.replace(", 3)", ", 1, 3)")
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(f"{sys.argv[2]}/{name}", "wb") as f:
        f.write(raw[:8] + struct.pack("<H", len(header)) + header.encode() + raw[10 + n:])
PY
    run own_3d 2 --set model.name=torchscript --set data.path="$out/reg3" --set model.path="$reg"
    [ "$rc" = 0 ] || { cat "$out/own_3d.log"; fail "module_loss on targets of N x 1 x 3: exit $rc"; }
    [ "$(json own_3d eval_loss)" = "$(json own eval_loss)" ] \
      || fail "targets of N x 1 x 3: eval_loss $(json own_3d eval_loss), N x 3: $(json own eval_loss)"
    run own3 3 "${own[@]}" --set model.path="$reg" --set batch.global=18  # 120 = 6 x 18 + 12: padded
    [ "$rc" = 0 ] || { cat "$out/own3.log"; fail "module_loss on 3 ranks: exit $rc"; }
    python3 -c 'import json, sys
h = json.load(open(sys.argv[1]))["history"]
assert h[-1]["eval_loss"] < h[0]["eval_loss"] / 2, h' "$out/own3/report.json" \
      || fail "the loss did not fall on 3 ranks"
    # Note [module loss]: a mean cannot leave the padding out; without padding it trains.
    run mean 2 "${own[@]}" --set model.path="$mean"
    expect_error mean 2 "model.path: $mean: forward(x, target) returned the batch's mean loss (a 0-d tensor), which cannot leave out the padding of batch.last_batch: pad (samples of weight 0); return one loss per sample instead, a [N] tensor (reduction='none', e.g. F.mse_loss(out, target, reduction='none').mean(1)), or use batch.last_batch: drop"
    run mean_drop 2 "${own[@]}" --set model.path="$mean" --set batch.last_batch=drop
    [ "$rc" = 0 ] || { cat "$out/mean_drop.log"; fail "a mean without padding: exit $rc"; }
    python3 -c 'import json, sys
h = json.load(open(sys.argv[1]))["history"]
assert h[-1]["eval_loss"] < h[0]["eval_loss"] / 2, h' "$out/mean_drop/report.json" \
      || fail "the mean's loss did not fall"
    run one_input 2 "${own[@]}" --set model.path="$src/tests/data/tiny_cnn.pt" --set task.name=module_loss
    expect_error one_input 2 "task.name: module_loss calls forward(x, target), but $src/tests/data/tiny_cnn.pt's forward takes one input (x)"
    echo "ok: a module's own loss trained on 2 and 3 ranks with padding; a mean refused with padding, trained without"
    ;;
  module_lm)
    cfg=$src/configs/gpt-tiny.yaml
    lm=$src/tests/data/lm_loss.pt
    "$make" tokens --text "$src/README.md" --out "$out/tok" --val-fraction 0.1 >/dev/null \
      || fail "make_data tokens"
    # The bound: in PyTorch, the same module and windows (AdamW at 0.03, no schedule)
    # reached a held-out loss of 2.95 after 10 epochs (3.19 at 0.01); untrained it is
    # above ln 256 = 5.55.
    run lm 2 --set data.path="$out/tok/train.bin" --set data.val_path="$out/tok/val.bin" \
      --set model.name=torchscript --set model.path="$lm" --set optim.lr=0.03
    [ "$rc" = 0 ] || { cat "$out/lm.log"; fail "module language model: exit $rc"; }
    grep -qF "task: module_loss (task.name: auto; $lm's forward takes (x, target))" "$out/lm.log" \
      || { cat "$out/lm.log"; fail "the console does not say which task and why"; }
    python3 - "$out/lm" <<'PY' || fail "the module language model's loss and metric (above)"
import json, sys
run = sys.argv[1]
r = json.load(open(run + "/report.json"))
assert r["task"] == "module_loss", r["task"]
hist = r["history"]
assert all({"eval_loss", "eval_metric_1"} <= set(h) for h in hist), hist[-1]
assert r["eval_loss"] < 4.0, f"eval_loss {r['eval_loss']}: not below 4.0"
assert hist[-1]["eval_loss"] < hist[0]["eval_loss"], f"the loss did not fall: {hist}"
assert r["eval_metric_1"] > 0.1, f"token accuracy {r['eval_metric_1']} (uniform: 1/256)"
print(f"ok: eval loss {hist[0]['eval_loss']:.4g} -> {r['eval_loss']:.4g}, token accuracy {r['eval_metric_1']:.3g}")
PY
    grep -aqr 'eval/metric_1' "$out/lm/tensorboard" || fail "no eval/metric_1 in the TensorBoard events"
    echo "ok: a TorchScript language model with its own loss trained on token windows on 2 ranks"
    ;;
  *) fail "unknown scenario $scenario" ;;
esac
