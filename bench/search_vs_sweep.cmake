# Benchmark, not a test: the coordinated batch search against an exhaustive
# fixed-batch sweep of the same candidates, measured in the same run.
#
#   cmake -DBIN=build/launcher/batchdist -DCONFIG=configs/search-cpu.yaml -DNP=2 \
#         [-DSWEEP_STEPS=10] [-DMPIRUN=mpirun] [-DMPI_FLAGS="--oversubscribe"] \
#         [-DEXTRA="--set;search.max=256"] -P bench/search_vs_sweep.cmake
#
# Prints: the chosen per-GPU batch, its swept samples/s divided by the best swept
# samples/s (target >= 0.95), and the timed steps the search used per rank
# (target <= 40, warmups excluded). The sweep times each candidate alone, with
# SWEEP_STEPS timed steps, through the same training step the search uses.
if(NOT BIN OR NOT CONFIG)
  message(FATAL_ERROR "usage: cmake -DBIN=... -DCONFIG=... [-DNP=2] -P bench/search_vs_sweep.cmake")
endif()
if(NOT NP)
  set(NP 2)
endif()
if(NOT SWEEP_STEPS)
  set(SWEEP_STEPS 10)
endif()
if(NOT MPIRUN)
  set(MPIRUN mpirun)
endif()
if(NOT DEFINED MPI_FLAGS)
  set(MPI_FLAGS --oversubscribe)
  execute_process(COMMAND id -u OUTPUT_VARIABLE uid OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(uid STREQUAL "0")
    list(APPEND MPI_FLAGS --allow-run-as-root)
  endif()
else()
  separate_arguments(MPI_FLAGS)
endif()
if(NOT OUT)
  set(OUT /tmp/batchdist_bench_search_vs_sweep)  # -DOUT=... to keep it elsewhere
endif()
file(REMOVE_RECURSE ${OUT})

function(run_search out)
  execute_process(COMMAND ${MPIRUN} ${MPI_FLAGS} -np ${NP} ${BIN} search ${CONFIG} --quiet --research
      --output ${out} ${EXTRA} ${ARGN}
    RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "batchdist search failed (${rc}):\n${o}\n${e}")
  endif()
endfunction()

string(TIMESTAMP t0 "%s")
run_search(${OUT}/search)
string(TIMESTAMP t1 "%s")
file(READ ${OUT}/search/search.json res)
string(JSON chosen GET "${res}" chosen)
string(JSON steps GET "${res}" timed_steps)
string(JSON n LENGTH "${res}" candidates)
math(EXPR last "${n} - 1")

set(best 0)
set(best_m 0)
set(chosen_sweep 0)
message("per-GPU  search samples/s  sweep samples/s (${SWEEP_STEPS} timed steps)")
foreach(i RANGE ${last})
  string(JSON m GET "${res}" candidates ${i} per_gpu_batch)
  string(JSON failed GET "${res}" candidates ${i} failed)
  string(JSON sps GET "${res}" candidates ${i} samples_per_s)
  if(failed)
    message("${m}  failed in the search: skipped")
    continue()
  endif()
  run_search(${OUT}/sweep_${m} --set search.min=${m} --set search.max=${m}
    --set search.timed_steps=${SWEEP_STEPS} --set search.objective=max_fit)
  file(READ ${OUT}/sweep_${m}/search.json sw)
  string(JSON swept GET "${sw}" candidates 0 samples_per_s)
  message("${m}  ${sps}  ${swept}")
  execute_process(COMMAND awk "BEGIN { exit !(${swept} > ${best}) }" RESULT_VARIABLE not_better)
  if(NOT not_better)
    set(best ${swept})
    set(best_m ${m})
  endif()
  if(m EQUAL chosen)
    set(chosen_sweep ${swept})
  endif()
endforeach()
execute_process(COMMAND awk "BEGIN { printf \"%.3f\", ${chosen_sweep} / ${best} }"
  OUTPUT_VARIABLE ratio)
math(EXPR secs "${t1} - ${t0}")
message("")
message("chosen per-GPU batch: ${chosen} (best in the sweep: ${best_m})")
message("chosen samples/s / best sweep samples/s: ${ratio}  (target >= 0.95)")
message("timed steps used by the search, per rank: ${steps}  (target <= 40)")
message("search wall time: ${secs} s for ${n} candidates")
