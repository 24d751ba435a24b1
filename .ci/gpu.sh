#!/usr/bin/env bash
# The H100 job, run through the device tool from the repository root (never by CI, which has no GPU):
#   bash .ci/gpu.sh STAGE...      stages: info build build_bg build_wait test test2 grid_full test_huge sanitize
#                                 memcheck memcheck_plan racecheck sanitize_bwd memcheck_masks probe_masks tune tune_bwd sweep_cuda_attn sweep_cuda_softmax sweep_softmax
#                                 sweep_softmax_random profile probe_decode probe_two_parts memcheck_pytest racecheck_pytest
#                                 probe_softmax_window probe_cp ab
#                                 bench bench2 pack
# build_bg starts the extension build in the background (it takes minutes of the CPUs' time while
# the Triton-only tests compile their kernels); build_wait waits for it before the CUDA stages.
# `pack` (last) folds everything under $OUT into $OUT/gpu-out.tgz: the device tool returns only a
# few files per call (2026-11-22: a bench run's JSON and markdown were left behind, 8 files came).
# Each stage logs in full under $OUT (or ./gpu-out); a short summary is printed last.
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# Inside the checkout (build/ is git-ignored), so a warm device machine keeps the built extension
# from one call to the next.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/build/torch_ext}
# Triton's kernel cache there too: the attention tests are compile-bound (~2-5 s a case), and a
# second call on the warm machine finds what the first compiled.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/build/triton_cache}
export TILED_ATTN_FAILLOG=${TILED_ATTN_FAILLOG:-$OUT/failures.log}
export TILED_ATTN_TIMELOG=${TILED_ATTN_TIMELOG:-$OUT/durations.log}
export TILED_ATTN_BENCH_TRACE=${TILED_ATTN_BENCH_TRACE:-1}
# DESIGN §4: CI draws fixed seeds; the GPU job draws fresh ones (each failure prints its seed and
# the TILED_ATTN_SEED that reproduces it). Set TILED_ATTN_SEED=N to replay a run.
export TILED_ATTN_SEED=${TILED_ATTN_SEED:-random}
# Machines of several GPUs: NVLink multicast stays off (the device tool's KINDS.md: a program using
# it can take the host's shared GPUs out of service); spawned ranks inherit these.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
summary=()
BUILD_PY="import time; t=time.time(); from tiled_attn.cuda import _build; _build.load(); print('extension built in %.0fs' % (time.time()-t))"
stage() {  # stage NAME TIMEOUT_S CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-10s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$(tail -n 1 "$OUT/$name.log" | cut -c1-150)")")
  return 0
}
# cuDNN's SDPA kernel (torch's own error, the reference side of the attention checks) reports
# shared-memory hazards of its own (71 on 2026-11-22, none in ours): checked kernels are ours. At
# D > 128 the reference's SDPA runs torch's memory-efficient kernel (fmha_cutlassF), which reports
# thousands (2026-11-29) and makes the run slow: SAN_KERNELS=<substring> instruments only the kernels
# whose names contain it (e.g. flash_fwd_sm90), in place of the cuDNN exclusion.
racecheck() {
  local filter=(--kernel-name-exclude kns=cudnn)
  [ -n "${SAN_KERNELS:-}" ] && filter=(--kernel-name "kns=$SAN_KERNELS")
  stage racecheck "${SAN_TIMEOUT:-60}" compute-sanitizer --tool racecheck "${filter[@]}" \
    --error-exitcode 1 python tests/gpu_sanitize.py --quick --attention ${SAN_ARGS:-}
}
# A/B of csrc variants in one call (session 26's method): AB_VARIANTS, csrc directories (e.g. an
# untracked `git archive REV csrc | tar -x -C ab_base` carried to the device beside the tree's own
# `csrc`), each built side by side in build/ab_<dir>; then AB_CMD (bash -c) once per variant in the
# order given and again in reverse (a drift of the machine shows as a difference between the two
# rounds), each in its own process with TILED_ATTN_CSRC / TILED_ATTN_BUILD_DIR set. Logs:
# ab_build_<dir>.log, ab<round>_<dir>.log.
ab_stage() {
  local dirs=() names=() i v
  for v in ${AB_VARIANTS:?AB_VARIANTS: the csrc directories to compare}; do
    dirs+=("$(cd "$v" && pwd)"); names+=("$(echo "${v%/}" | tr '/.' '__')")
  done
  for i in "${!dirs[@]}"; do
    (stage "ab_build_${names[i]}" "${BUILD_TIMEOUT:-200}" env TILED_ATTN_CSRC="${dirs[i]}" \
       TILED_ATTN_BUILD_DIR="$PWD/build/ab_${names[i]}" python -c "$BUILD_PY"
     echo "${summary[-1]}" >"$OUT/ab_build_${names[i]}.summary") &
  done
  wait
  for i in "${!dirs[@]}"; do summary+=("$(cat "$OUT/ab_build_${names[i]}.summary")"); done
  local round seq
  for round in 1 2; do
    seq=("${!dirs[@]}")
    if [ "$round" = 2 ]; then seq=(); for ((i = ${#dirs[@]} - 1; i >= 0; i--)); do seq+=("$i"); done; fi
    for i in "${seq[@]}"; do
      stage "ab${round}_${names[i]}" "${AB_TIMEOUT:-120}" env TILED_ATTN_CSRC="${dirs[i]}" \
        TILED_ATTN_BUILD_DIR="$PWD/build/ab_${names[i]}" bash -c "${AB_CMD:?AB_CMD: the command to run per variant}"
    done
  done
}
for s in "$@"; do
  case "$s" in
    # e.g. AB_VARIANTS="ab_base/csrc csrc" AB_CMD="python benchmarks/tune_cuda_attention_backward.py" bash .ci/gpu.sh ab pack
    ab) ab_stage ;;
    info) stage info 60 bash -c 'nvidia-smi; python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"; nvcc --version | tail -2' ;;
    build) stage build "${BUILD_TIMEOUT:-200}" python -c "$BUILD_PY" ;;
    build_bg) (stage build "${BUILD_TIMEOUT:-200}" python -c "$BUILD_PY"; echo "${summary[-1]}" >"$OUT/build.summary") &
              BUILD_PID=$! ;;
    build_wait) wait "${BUILD_PID:-}" 2>/dev/null; summary+=("$(cat "$OUT/build.summary" 2>/dev/null || echo 'build      (no build_bg)')") ;;
    # Host time per eager call and its cProfile split (benchmarks/profile_host.py).
    profile) stage profile "${PROFILE_TIMEOUT:-120}" python benchmarks/profile_host.py --out "$OUT" ${PROFILE_ARGS:-} ;;
    # Parallel workers for the bulk (Triton compiles are CPU-bound); the >2^31-element cases
    # (~17 GB of GPU memory each) run alone afterwards so workers never contend for memory.
    test) stage test "${TEST_TIMEOUT:-300}" python -m pytest -v -n "${TEST_WORKERS:-12}" --dist loadgroup -p no:cacheprovider \
            --timeout=150 --durations=25 -rfE --tb=short -m "not huge" ${TEST_ARGS:-} ;;
    test2) stage test2 "${TEST2_TIMEOUT:-300}" python -m pytest -v -n "${TEST_WORKERS:-12}" --dist loadgroup -p no:cacheprovider \
            --timeout=150 --durations=25 -rfE --tb=short -m "not huge" ${TEST2_ARGS:-} ;;
    # The issue's attention grid in full product (2574 cases a backend; test_full_grid): shard it
    # over calls with TILED_ATTN_SHARD=i/n (tests/conftest.py).
    grid_full) stage grid_full "${GRID_TIMEOUT:-540}" env TILED_ATTN_FULL_GRID=1 python -m pytest -q -n "${TEST_WORKERS:-12}" \
            --dist loadgroup -p no:cacheprovider --timeout=150 -rfE --tb=short tests/test_attention.py \
            -k test_full_grid ${GRID_ARGS:-} ;;
    test_huge) stage test_huge "${HUGE_TIMEOUT:-100}" python -m pytest -v -p no:cacheprovider --timeout=90 \
            -rfE --tb=short -m huge ${TEST_ARGS:-} ;;
    sanitize)
      stage memcheck "${SAN_TIMEOUT:-60}" compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu_sanitize.py --quick --attention
      racecheck ;;
    racecheck) racecheck ;;
    # The Triton attention backward kernels alone (no extension build needed) under both tools.
    sanitize_bwd)
      stage memcheck_bwd "${SAN_TIMEOUT:-120}" compute-sanitizer --tool memcheck --error-exitcode 1 \
        python tests/gpu_sanitize.py --no-softmax --attention-backward --quick ${SAN_BWD_ARGS:-}
      stage racecheck_bwd "${SAN_TIMEOUT:-120}" compute-sanitizer --tool racecheck --kernel-name-exclude kns=cudnn --error-exitcode 1 \
        python tests/gpu_sanitize.py --no-softmax --attention-backward --quick ${SAN_BWD_ARGS:-} ;;
    # Issue #15's kernels (window, softcap, ALiBi, key masks, varlen, KV cache) under memcheck.
    memcheck_masks) stage memcheck_masks "${SAN_TIMEOUT:-120}" compute-sanitizer --tool memcheck --error-exitcode 1 \
            python -m pytest -q -p no:cacheprovider -x tests/test_masks.py -k "${SAN_MASKS_K:-not bad_input}" ;;
    # memcheck over any pytest selection (SAN_PYTEST_ARGS, word-split like TEST_ARGS).
    racecheck_pytest) stage racecheck_pytest "${SAN_TIMEOUT:-120}" compute-sanitizer --tool racecheck --error-exitcode 1 \
            python -m pytest -q -p no:cacheprovider -x ${SAN_PYTEST_ARGS:-} ;;
    # Context parallelism (issue 17), one GPU per rank: the merge A/B and a kernel profile per rank.
    probe_cp) stage probe_cp "${PROBE_TIMEOUT:-300}" python benchmarks/probe_context_parallel.py --out "$OUT/probe_cp" ${PROBE_ARGS:-} ;;
    memcheck_pytest) stage memcheck_pytest "${SAN_TIMEOUT:-120}" compute-sanitizer --tool memcheck --error-exitcode 1 \
            python -m pytest -q -p no:cacheprovider -x ${SAN_PYTEST_ARGS:-} ;;
    # The row softmax's window reads on and off, beside torch.softmax and backend=None (issue 16).
    probe_softmax_window) stage probe_softmax_window "${PROBE_TIMEOUT:-300}" python benchmarks/probe_softmax_window.py \
            --out "$OUT/probe_softmax_window.json" ${PROBE_ARGS:-} ;;
    probe_masks) stage probe_masks "${PROBE_TIMEOUT:-200}" python benchmarks/probe_masks.py --out "$OUT/probe_masks.json" ;;
    # SAN_ARGS: more gpu_sanitize.py options, e.g. --attention-kernels wgmma_ws (the sm90 kernels).
    memcheck) stage memcheck "${SAN_TIMEOUT:-60}" compute-sanitizer --tool memcheck --error-exitcode 1 python tests/gpu_sanitize.py --quick --attention ${SAN_ARGS:-} ;;
    # The Triton kernels launched from cached plans (triton/launch.py) under memcheck: the
    # compiled-kernel path after JIT dispatch, a misaligned specialization, a captured graph.
    memcheck_plan) stage memcheck_plan "${SAN_TIMEOUT:-90}" compute-sanitizer --tool memcheck --error-exitcode 1 \
            python -m pytest -q -p no:cacheprovider tests/test_plan.py -k "launch or fast or graph_capture" ;;
    tune_bwd) stage tune_bwd "${TUNE_TIMEOUT:-300}" python benchmarks/tune_triton_attention_backward.py --out "$OUT/tuned_attention_backward.txt" ${TUNE_ARGS:-} ;;
    tune) stage tune "${TUNE_TIMEOUT:-300}" python benchmarks/tune_triton_attention.py --out "$OUT/tuned_attention.py" ${TUNE_ARGS:-} ;;
    sweep_cuda_attn) stage sweep_cuda_attn "${SWEEP_TIMEOUT:-240}" python benchmarks/sweep_cuda_attention.py \
            --out "$OUT/cuda_attn_sweep" --build-dir "$PWD/build/cuda_attn_sweep" ${SWEEP_ARGS:-} ;;
    sweep_cuda_softmax) stage sweep_cuda_softmax "${SWEEP_TIMEOUT:-240}" python benchmarks/sweep_cuda_softmax.py \
            --out "$OUT/cuda_softmax_sweep" ${SWEEP_CUDA_ARGS:-} ;;
    sweep_softmax) stage sweep_softmax "${SWEEP_TIMEOUT:-240}" python benchmarks/sweep_triton_softmax.py \
            --out "$OUT/softmax_sweep" ${SWEEP_ARGS:-} ;;
    # Issue 16's random shapes: every kernel timed eager, backend=None's selection fitted per GPU
    # model (configs.model_arch) and checked on the held-out set; --apply it afterwards, on the CPU.
    sweep_softmax_random) stage sweep_softmax_random "${SWEEP_RANDOM_TIMEOUT:-430}" python benchmarks/sweep_softmax_random.py \
            --out "$OUT/softmax_random" --budget "${SWEEP_RANDOM_BUDGET:-400}" --jobs "${TEST_WORKERS:-12}" ;;
    # e2e decode, "tiled_attn" vs "sdpa": interleaved generate() passes and where a step's time goes.
    # The Triton forward's head dim in one padded tile or two power-of-two parts, against cuDNN.
    probe_two_parts) stage probe_two_parts "${PROBE_TIMEOUT:-200}" python benchmarks/probe_two_parts.py \
            --out "$OUT/probe_two_parts.json" ${PROBE_ARGS:-} ;;
    probe_decode) stage probe_decode "${PROBE_TIMEOUT:-200}" python benchmarks/probe_e2e_decode.py --out "$OUT" ${PROBE_ARGS:-} ;;
    bench) stage bench "${BENCH_TIMEOUT:-420}" python -m benchmarks --out "$OUT/results" ${BENCH_ARGS:-} ;;
    # A second benchmark run in the same call: --providers filters every suite it names, so suites
    # that need different provider lists run apart (e.g. softmax's kernels vs kvcache's layouts).
    bench2) stage bench2 "${BENCH2_TIMEOUT:-420}" python -m benchmarks --out "$OUT/results" ${BENCH2_ARGS:-} ;;
    pack) ;;  # after the summary, below
    *) echo "unknown stage $s" >&2 ;;
  esac
done
echo "==== summary ===="
printf '%s\n' "${summary[@]}"
if [[ " $* " == *" pack "* ]]; then
  printf '%s\n' "${summary[@]}" >"$OUT/summary.txt"
  tmp=$(mktemp -d) && tar -czf "$tmp/gpu-out.tgz" -C "$OUT" . && rm -rf "${OUT:?}"/* && mv "$tmp/gpu-out.tgz" "$OUT/"
fi
