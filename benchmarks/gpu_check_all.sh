#!/usr/bin/env bash
# Everything a Hopper GPU machine (one GPU, 16 cores) is wanted for, in one command of at
# most 8 minutes: benchmarks/gpu_check.py on the Triton and the Mosaic GPU paths, each
# split over SLICES processes side by side (the checks compile on the CPU cores and are
# short on the GPU), then benchmarks/gpu_speed.py alone on the GPU (its timings share
# the card with nothing). Writes into OUT:
#   summary.txt   what passed and failed on each path, and the speed table
#   speed.md      the table for benchmarks/RESULTS.md; speed.json its numbers
#   attention_probes.json  benchmarks/mgpu_attention_probes.py's variants of Mosaic GPU
#                 attention against jax's Hopper kernel and cuDNN (after the table)
#   tuning.tgz    with TUNE=1: the specs' tuning files after `pallasgen tune --gpu` (below)
#   logs.tgz      each slice's whole log
#
#   benchmarks/gpu_check_all.sh OUT            # on the GPU machine
#   benchmarks/gpu_check_all.sh OUT --dry-run  # here, on CPU: every step starts, on a few kernels
#
# PYTHON names the interpreter (python3). The check and the speed steps have their own
# time limits (CHECK_SECONDS, SPEED_SECONDS) so that one hung kernel cannot take the
# machine's whole lease; a step cut short says so in summary.txt. TUNE=1 then runs
# `pallasgen tune --gpu` on both paths for each of TUNED (kernel and sizes), TUNE_SECONDS
# each, from a copy of pallasgen laid out as installed (a checkout on PYTHONPATH has no
# pallasgen.templates: it renders nothing); on CPU (--dry-run) it only shows that the
# tune starts (and finds no CUDA device).
set -uo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: benchmarks/gpu_check_all.sh OUT [--dry-run]}
dry_run=${2:-}
python=${PYTHON:-python3}
slices=${SLICES:-8}
check_seconds=${CHECK_SECONDS:-270}
speed_seconds=${SPEED_SECONDS:-210}
probe_seconds=${PROBE_SECONDS:-150}
tune_seconds=${TUNE_SECONDS:-60}
# Products short of XLA in the H200's table (benchmarks/RESULTS.md), at its sizes.
tuned=(${TUNED:-"batched_matmul:B=8,M=2048,N=2048,K=2048"})
classes=(ragged small single aligned)
parts=$slices
speed_flags=()
probe_flags=()
if [[ $dry_run == --dry-run ]]; then
    # A twelfth of the kernels at one size class, interpreted; the speed rows at 1/64 size.
    slices=2 parts=24 classes=(single) speed_flags=(--tiny --repeats 1) probe_flags=(--dry-run)
elif [[ -n $dry_run ]]; then
    echo "usage: benchmarks/gpu_check_all.sh OUT [--dry-run]" >&2
    exit 2
fi
mkdir -p "$out/logs"
# Many processes share the GPU: each takes memory as it needs it.
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
started=$SECONDS

pids=()
for path in triton mosaic_gpu; do
    for ((i = 0; i < slices; i++)); do
        timeout "$check_seconds" "$python" benchmarks/gpu_check.py --gpu-backend "$path" --slice "$i/$parts" \
            "${classes[@]}" >"$out/logs/check-$path-$i.log" 2>&1 &
        pids+=($!)
    done
done
for pid in "${pids[@]}"; do wait "$pid"; done
check_done=$SECONDS

timeout "$speed_seconds" "$python" benchmarks/gpu_speed.py --out "$out" "${speed_flags[@]}" \
    >"$out/logs/speed.log" 2>&1
speed_status=$?

speed_done=$SECONDS

timeout "$probe_seconds" "$python" benchmarks/mgpu_attention_probes.py --out "$out" "${probe_flags[@]}" \
    >"$out/logs/probes.log" 2>&1
probe_status=$?
if [[ $probe_status == 124 ]]; then
    # A variant hung the GPU: the others after it, once more (the probes name each as they check it).
    hung=$(grep ': checking$' "$out/logs/probes.log" | tail -1 | awk '{print $2}' | tr -d :)
    mapfile -t rest < <("$python" -c "import sys; sys.argv = ['']; sys.path.insert(0, 'benchmarks')
import mgpu_attention_probes as p; names = list(p.VARIANTS); print(*names[names.index('$hung') + 1:], sep='\n')" 2>/dev/null)
    if ((${#rest[@]})); then
        echo "probes: $hung hung; again with ${rest[*]}" >>"$out/logs/probes.log"
        timeout "$probe_seconds" "$python" benchmarks/mgpu_attention_probes.py "${rest[@]}" >>"$out/logs/probes.log" 2>&1
    fi
fi
probes_done=$SECONDS

if [[ ${TUNE:-} == 1 ]]; then
    # pallasgen as installed (its templates as pallasgen.templates), imported first (-P: not the checkout's).
    site=$(mktemp -d)
    cp -r pallasgen "$site/" && cp -r templates "$site/pallasgen/templates"
    : >"$out/logs/tune.log"
    for entry in "${tuned[@]}"; do
        kernel=${entry%%:*} sizes=()
        IFS=, read -ra pairs <<<"${entry#*:}"
        for pair in "${pairs[@]}"; do sizes+=(--size "$pair"); done
        for path in mosaic_gpu triton; do
            PYTHONPATH="$site:${PYTHONPATH:-}" timeout "$tune_seconds" "$python" -P -m pallasgen tune \
                "specs/matmul.pallas:$kernel" --gpu --gpu-backend "$path" "${sizes[@]}" --budget 8 >>"$out/logs/tune.log" 2>&1
            echo "tune $kernel on $path: exit $?" >>"$out/logs/tune.log"
        done
    done
    tar czf "$out/tuning.tgz" specs/*.tuning.json
fi

{
    echo "gpu_check (${classes[*]}; $slices slices a path of 1/$parts each): $((check_done - started)) s"
    for path in triton mosaic_gpu; do
        logs=("$out"/logs/check-"$path"-*.log)
        ok=$(cat "${logs[@]}" | grep -c '^OK ')
        failed=$(cat "${logs[@]}" | grep -c '^FAIL ')
        refused=$(cat "${logs[@]}" | grep -c '^REFUSED ')
        finished=$(cat "${logs[@]}" | grep -c ' failed$')
        echo "$path: $ok passed, $failed failed, $refused refused (the kernel's own error); $finished of $slices slices finished"
        cat "${logs[@]}" | grep -E '^(FAIL|REFUSED) ' | sort
        for log in "${logs[@]}"; do
            grep -q ' failed$' "$log" || { echo "  $log did not finish; its end:"; tail -5 "$log" | sed 's/^/    /'; }
        done
    done
    echo
    echo "gpu_speed (exit $speed_status, $((speed_done - check_done)) s):"
    if [[ -f $out/speed.md ]]; then cat "$out/speed.md"; else tail -20 "$out/logs/speed.log"; fi
    echo
    echo "mgpu_attention_probes (exit $probe_status, $((probes_done - speed_done)) s):"
    grep -E "^(causal|full) " "$out/logs/probes.log" || tail -5 "$out/logs/probes.log"
    if [[ ${TUNE:-} == 1 ]]; then
        echo
        echo "pallasgen tune --gpu ($((SECONDS - probes_done)) s):"
        grep -E "^tune |Error|error:|best|blocks" "$out/logs/tune.log" | tail -20
    fi
} >"$out/summary.txt"
tar czf "$out/logs.tgz" -C "$out" logs && rm -r "$out/logs"
cat "$out/summary.txt"
