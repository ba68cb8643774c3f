# End to end, real measurement, MPMD ranks with different CPU memory limits:
#   mpirun -np 1 batchdist search CFG --set search.memory_limit_mb=LOOSE
#        : -np 1 batchdist search CFG --set search.memory_limit_mb=TIGHT
# The choice must fit the tighter rank (rank 1). TIGHT is calibrated from an
# unlimited run on this machine, halfway between the smallest and largest peaks.
file(REMOVE_RECURSE ${OUT})
set(common search ${CFG} --quiet --set search.objective=max_fit --set search.max=256
    --set search.warmup_steps=1 --set search.timed_steps=1 --set search.min_time_s=0
    --set search.max_time_s=0.2)
execute_process(COMMAND ${MPIRUN} ${MPI_FLAGS} -np 2 ${BIN} ${common} --output ${OUT}/calibrate
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "calibration run failed (${rc}):\n${out}\n${err}")
endif()
file(READ ${OUT}/calibrate/search.json cal)
string(JSON n LENGTH "${cal}" candidates)
math(EXPR last "${n} - 1")
string(JSON small GET "${cal}" candidates 0 peak_memory_mb)
string(JSON large GET "${cal}" candidates ${last} peak_memory_mb)
string(REGEX REPLACE "\\..*" "" small "${small}")
string(REGEX REPLACE "\\..*" "" large "${large}")
math(EXPR tight "(${small} + ${large}) / 2")
message(STATUS "calibration: peak ${small} MB at the smallest, ${large} MB at the largest; tight limit ${tight} MB")
if(large LESS_EQUAL small)
  message(FATAL_ERROR "peak memory does not grow with the batch (${small} -> ${large} MB)")
endif()

execute_process(COMMAND ${MPIRUN} ${MPI_FLAGS}
    -np 1 ${BIN} ${common} --output ${OUT}/mpmd --set search.memory_limit_mb=100000 :
    -np 1 ${BIN} ${common} --output ${OUT}/mpmd --set search.memory_limit_mb=${tight}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "MPMD run failed (${rc}):\n${out}\n${err}")
endif()
file(READ ${OUT}/mpmd/search.json res)
string(JSON chosen GET "${res}" chosen)
string(JSON budget GET "${res}" memory_budget_mb)
string(JSON n LENGTH "${res}" candidates)
math(EXPR last "${n} - 1")
set(rank1_failed FALSE)
foreach(i RANGE ${last})
  string(JSON m GET "${res}" candidates ${i} per_gpu_batch)
  string(JSON reason GET "${res}" candidates ${i} reason)
  # Rank 1's own peak: the max over ranks includes the loose rank 0.
  string(JSON peak GET "${res}" candidates ${i} rank_peak_memory_mb 1)
  if(reason MATCHES "over memory budget on rank 1")
    set(rank1_failed TRUE)
  endif()
  if(m EQUAL chosen)
    string(REGEX REPLACE "\\..*" "" peak_int "${peak}")
    if(peak_int GREATER tight)
      message(FATAL_ERROR "chosen ${chosen} peaks at ${peak} MB on rank 1, above its limit ${tight} MB")
    endif()
  endif()
endforeach()
if(NOT rank1_failed)
  message(FATAL_ERROR "no candidate failed on the tighter rank 1:\n${res}")
endif()
string(REGEX REPLACE "\\..*" "" budget "${budget}")
if(NOT budget EQUAL tight)
  message(FATAL_ERROR "memory budget ${budget} MB is not the tighter rank's ${tight} MB")
endif()
message(STATUS "ok: chose per-GPU ${chosen} under the tighter limit ${tight} MB (rank 1)")
