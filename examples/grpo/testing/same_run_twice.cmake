# Runs the GRPO job on an environment twice with the same seed and fails unless the two runs'
# rewards and losses are equal step for step: an end-to-end check of the --env path (engines,
# environment processes, training) that holds on every machine, where what the job learns
# depends on the CPU's kernels and the dtype (the learning demonstration is in README.md). The
# job's GRPO groups run concurrently, so a turn's batch-mates on the engines differ from run to
# run: --batch-invariant makes each row's numerics independent of them. The runs compute in
# fp32 (--compute-dtype fp32), so the check is the same on every CPU: with the bf16 default of a
# CPU with fast bf16 GEMMs, about one pair of runs in five differed from step 4 on in the 7th
# digit of the entropy (seen after the trainer's log-probs moved to the sampling temperature;
# 0 of 14 pairs differed in fp32). Where the bf16 difference comes from is not known yet.
#   cmake -DGRPO=<grpo_example> -DMODEL=<dir> -DPYTHON=<python3> -DENV_SCRIPT=<game.py>
#         -DOUT=<path prefix> -P same_run_twice.cmake
foreach(var GRPO MODEL PYTHON ENV_SCRIPT OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "same_run_twice.cmake: -D${var}=... is missing")
  endif()
endforeach()
foreach(tag a b)
  execute_process(
    COMMAND ${GRPO} --quiet --model ${MODEL} --seed 1 --steps 6 --lr 5e-3 --turn-tokens 8
            --batch-invariant --compute-dtype fp32
            --env-task "{\"secret\": 7, \"max_turns\": 3}" --env "${PYTHON} ${ENV_SCRIPT}"
            --metrics ${OUT}_${tag}.jsonl --plot ${OUT}_${tag}.png
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "run ${tag} failed (exit ${rc}):\n${out}\n${err}")
  endif()
endforeach()
file(STRINGS ${OUT}_a.jsonl a)
file(STRINGS ${OUT}_b.jsonl b)
list(LENGTH a steps)
list(LENGTH b steps_b)
if(NOT steps EQUAL 6 OR NOT steps_b EQUAL 6)
  message(FATAL_ERROR "expected 6 metric records per run, got ${steps} and ${steps_b}")
endif()
math(EXPR last "${steps} - 1")
foreach(i RANGE ${last})
  list(GET a ${i} line_a)
  list(GET b ${i} line_b)
  foreach(field reward loss)
    string(JSON va GET "${line_a}" ${field})
    string(JSON vb GET "${line_b}" ${field})
    if(NOT va STREQUAL vb)
      math(EXPR step "${i} + 1")
      message(FATAL_ERROR "step ${step}: ${field} ${va} in the first run, ${vb} in the second")
    endif()
  endforeach()
endforeach()
message("grpo: the same run twice: ${steps} steps, equal rewards and losses")
