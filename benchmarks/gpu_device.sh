#!/usr/bin/env bash
# The one command the GPU machine runs, from the repository root: benchmarks/gpu_check.py with that machine's own
# python3 and torch, and the wheels it lacks carried in .whl/ (`make gpu-wheels`), on a machine with no network.
#
#   bash benchmarks/gpu_device.sh              # the full check: ends within 8 minutes, the install included
#   bash benchmarks/gpu_device.sh --quick      # one round of fewer steps: ends within about 4 minutes
#   bash benchmarks/gpu_device.sh --rehearsal  # no GPU: the tiny model on CPU, NVML's stand-in, an injected OOM
#
# Further arguments go to gpu_check.py (the last value of a flag wins). Then, in the time left (60 s at least),
# benchmarks/gpu_acceleration.py runs the GPU-only acceleration flags where their libraries are here (their refusals
# where not). With $OUT set, gpu_check.md, gpu_check.json, gpu_acceleration.md, gpu_device.log (this command's output)
# and gpu_jobs.log (each job's stderr, its last MiB) are written there.
# Exit code: gpu_check.py's, else gpu_acceleration.py's; 124 when the time limit ended one; 3 when .whl/ is missing
# or does not install.
set -uo pipefail

LIMIT_S=${GPU_DEVICE_LIMIT_S:-480}  # the whole command
JOB_LOG_BYTES=$((1024 * 1024))
out=${OUT:-}
if [ -n "$out" ] && [ -z "${GPU_DEVICE_LOGGED:-}" ]; then  # this script again, its output also into the log
    mkdir -p "$out"
    GPU_DEVICE_LOGGED=1 bash "$0" "$@" 2>&1 | tee "$out/gpu_device.log"
    exit "${PIPESTATUS[0]}"
fi
started=$SECONDS

mode=full
check_flags=()
for argument in "$@"; do
    case $argument in
        --quick) mode=quick ;;
        --rehearsal) mode=rehearsal ;;
        *) check_flags+=("$argument") ;;
    esac
done
case $mode in
    quick) mode_flags=(--rounds 1 --max_steps 30 --warmup_steps 5) ;;
    rehearsal) mode_flags=(
        --cpu_rehearsal --oom_callbacks tests.helpers.bench_callbacks:OutOfMemoryOnLastRank
        --hidden_size 64 --intermediate_size 128 --num_layers 2 --num_attention_heads 4 --num_key_value_heads 2
        --seq_length 32 --batch_size 2 --max_steps 4 --warmup_steps 1 --rounds 1 --oom_batch_size 3
        --torch_dtype float32 --threads 1 --system_metrics_interval 0.2
    ) ;;
    *) mode_flags=() ;;
esac

site=$(mktemp -d /tmp/gpu-device-site.XXXXXX)
work=$(mktemp -d /tmp/gpu-device-work.XXXXXX)
trap 'rm -rf "$site" "$work"' EXIT
shopt -s nullglob
wheels=(.whl/*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    echo "gpu_device: no wheels in .whl/ (run \`make gpu-wheels\` where the registry is reachable, carry .whl)" >&2
    exit 3
fi
echo "--- installing ${#wheels[@]} wheels from .whl/ into $site"
python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${wheels[@]}" \
    || { echo "gpu_device: the wheels in .whl/ did not install (pip's error above)" >&2; exit 3; }
export PYTHONPATH="$site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ "$mode" = rehearsal ]; then
    # NVML's stand-in shadows the real one, with one made-up H200 under load.
    export PYTHONPATH="$PWD/tests/helpers/fake_nvml:$PYTHONPATH" CUDA_VISIBLE_DEVICES=0
    export FAKE_NVML_DEVICES='[{"uuid": "GPU-00000000-1111-2222-3333-444444444444", "name": "Fake H200",
        "utilization": 97, "memory_used": 64424509440, "power_mw": [450000, 510000], "enforced_limit_mw": 600000,
        "temperature": 66}]'
fi
echo "--- python3: $(command -v python3), $(python3 --version 2>&1); what the check imports, version and folder:"
python3 - <<'EOF'
from importlib import metadata

names = "torch transformers trl peft accelerate datasets tokenizers safetensors aim pydantic fire psutil pyyaml"
for name in [*names.split(), "nvidia-ml-py", "pyarrow", "pandas", "huggingface-hub", "numpy"]:
    try:
        distribution = metadata.distribution(name)
        print(f"  {name}=={distribution.version}  {distribution.locate_file('')}")
    except metadata.PackageNotFoundError:
        print(f"  {name}: not installed")
EOF

output=${out:-.}/gpu_check.md
left_s=$((LIMIT_S - (SECONDS - started) - 15))  # 15 s to collect the logs
echo "--- gpu_check ($mode), at most ${left_s} s"
timeout --kill-after=10 "$left_s" python3 -m benchmarks.gpu_check --output "$output" --workdir "$work/check" \
    "${mode_flags[@]}" "${check_flags[@]}"
status=$?
[ $status -eq 124 ] && echo "gpu_device: the check ran out of its ${left_s} s and was stopped: no table" >&2

# The GPU-only acceleration flags (--fast_kernels, --auto_gptq with --fused_lora): run where their libraries are
# here, their refusals checked where not (benchmarks/gpu_acceleration.py), in what time the check left.
left_s=$((LIMIT_S - (SECONDS - started) - 15))
if [ "$left_s" -ge 60 ]; then
    echo "--- gpu_acceleration, at most ${left_s} s"
    timeout --kill-after=10 "$left_s" python3 -m benchmarks.gpu_acceleration \
        --output "${out:-.}/gpu_acceleration.md"
    accel_status=$?
    [ $status -eq 0 ] && status=$accel_status
else
    echo "gpu_device: ${left_s} s left: no time for benchmarks/gpu_acceleration.py" >&2
fi

if [ -n "$out" ]; then
    for log in "$work"/check/*/stderr.log; do
        echo "=== ${log#"$work/check/"} (its last $JOB_LOG_BYTES bytes)"
        tail -c "$JOB_LOG_BYTES" "$log"
        echo
    done > "$out/gpu_jobs.log"
fi
echo "--- gpu_device: exit $status after $((SECONDS - started)) s"
exit $status
