# Benchmark, not a test: the coordinated batch search against an exhaustive,
# interleaved fixed-batch sweep of the same candidates, measured in the same run.
#
#   cmake -DBIN=build/launcher/batchdist -DCONFIG=configs/search-cpu.yaml -DNP=2 \
#         [-DRUNS=10] [-DSWEEP_SECONDS=2] [-DMPIRUN=mpirun] [-DMPI_FLAGS="--oversubscribe"] \
#         [-DEXTRA="--set;search.max=256"] -P bench/search_vs_sweep.cmake
#
# RUNS times: one search (a fresh process, as a user runs it), then one sweep round:
# every candidate size seen so far, each timed alone in its own process for
# SWEEP_SECONDS through the same training step. The sweep's ground truth for a
# size is the median over its rounds, so slow drift of the machine hits the
# searches and every size alike. Prints per run: the chosen per-GPU batch, its
# swept samples/s divided by the best swept samples/s (target >= 0.95), and the
# search's cost (timed steps per rank, seconds; target < 20 s); then how many runs
# reached the target.
cmake_policy(SET CMP0057 NEW)  # if(IN_LIST)
if(NOT BIN OR NOT CONFIG)
  message(FATAL_ERROR "usage: cmake -DBIN=... -DCONFIG=... [-DNP=2] [-DRUNS=10] -P bench/search_vs_sweep.cmake")
endif()
if(NOT NP)
  set(NP 2)
endif()
if(NOT RUNS)
  set(RUNS 10)
endif()
if(NOT SWEEP_SECONDS)
  set(SWEEP_SECONDS 2)
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

# awk one-liners: the median of a ;-list, and a comparison.
function(median list outvar)
  string(REPLACE ";" " " xs "${list}")
  execute_process(COMMAND awk "BEGIN { n = split(\"${xs}\", a, \" \"); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }; printf \"%.1f\", n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }"
    OUTPUT_VARIABLE m)
  set(${outvar} ${m} PARENT_SCOPE)
endfunction()

set(sizes "")
set(chosen_list "")
message("run  chosen  search: timed steps  seconds   (sweep round: size=samples/s ...)")
foreach(run RANGE 1 ${RUNS})
  string(TIMESTAMP t0 "%s")
  run_search(${OUT}/search_${run})
  file(READ ${OUT}/search_${run}/search.json res)
  string(JSON chosen GET "${res}" chosen)
  string(JSON steps GET "${res}" timed_steps)
  string(JSON secs GET "${res}" seconds)
  string(JSON n LENGTH "${res}" candidates)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    string(JSON m GET "${res}" candidates ${i} per_gpu_batch)
    string(JSON failed GET "${res}" candidates ${i} failed)
    if(NOT failed AND NOT m IN_LIST sizes)
      list(APPEND sizes ${m})
    endif()
  endforeach()
  list(APPEND chosen_list ${chosen})
  set(search_secs_${run} ${secs})
  set(search_steps_${run} ${steps})
  # One sweep round over every size seen so far.
  set(round "")
  foreach(m ${sizes})
    run_search(${OUT}/sweep_${run}_${m} --set search.min=${m} --set search.max=${m}
      --set search.objective=max_fit --set search.rounds=0 --set search.max_steps=100000
      --set search.min_time_s=${SWEEP_SECONDS} --set search.max_time_s=${SWEEP_SECONDS})
    file(READ ${OUT}/sweep_${run}_${m}/search.json sw)
    string(JSON swept GET "${sw}" candidates 0 samples_per_s)
    list(APPEND swept_${m} ${swept})
    string(APPEND round " ${m}=${swept}")
  endforeach()
  execute_process(COMMAND awk "BEGIN { printf \"%.1f\", ${secs} }" OUTPUT_VARIABLE secs1)
  message("${run}  ${chosen}  ${steps}  ${secs1}   (${round} )")
endforeach()

# Ground truth: the median over rounds per size.
set(best 0)
set(best_m 0)
message("")
message("sweep (median over its rounds): per-GPU  samples/s  rounds")
list(SORT sizes COMPARE NATURAL)
foreach(m ${sizes})
  median("${swept_${m}}" truth_${m})
  list(LENGTH swept_${m} k)
  message("  ${m}  ${truth_${m}}  ${k}")
  execute_process(COMMAND awk "BEGIN { exit !(${truth_${m}} > ${best}) }" RESULT_VARIABLE not_better)
  if(NOT not_better)
    set(best ${truth_${m}})
    set(best_m ${m})
  endif()
endforeach()
message("best in the sweep: per-GPU ${best_m} at ${best} samples/s")
message("")
message("run  chosen  chosen/best (target >= 0.95)  search seconds (target < 20)")
set(good 0)
set(i 0)
foreach(chosen ${chosen_list})
  math(EXPR i "${i} + 1")
  execute_process(COMMAND awk "BEGIN { printf \"%.3f\", ${truth_${chosen}} / ${best} }"
    OUTPUT_VARIABLE ratio)
  execute_process(COMMAND awk "BEGIN { exit !(${ratio} >= 0.95 && ${search_secs_${i}} < 20) }"
    RESULT_VARIABLE miss)
  if(NOT miss)
    math(EXPR good "${good} + 1")
  endif()
  execute_process(COMMAND awk "BEGIN { printf \"%.1f\", ${search_secs_${i}} }" OUTPUT_VARIABLE s1)
  message("${i}  ${chosen}  ${ratio}  ${s1}")
endforeach()
message("runs with chosen/best >= 0.95 and search < 20 s: ${good} of ${RUNS}")
