#!/usr/bin/env bash
# The GPU check on a bare NVIDIA machine with no package index, from `make gpu-bundle`'s bundle.
#
#   bench/gpu_device.sh OUT        from the repository root, with .gpu-bundle/ beside it
#   bench/gpu_device.sh --steps    the steps, in order: whether each needs a GPU, its expected seconds
#
# Steps: the bundle's wheels into a folder on PYTHONPATH (where the interpreter is not
# CPython 3.12, as in a rehearsal, they are only resolved for it); SmolLM2's layout with
# zero weights; prepare: mrunner's build up to compiling, for the CPU, offline, in seconds
# (where it finds CMake and ninja: on PATH, beside the interpreter, in their Python
# packages; and that pip asks for nothing the bundle lacks); llama-server built by mrunner
# itself from the bundle's sdist, offline (GPU_DEVICE_VARIANT=cuda, the default, for the
# GPU found: one architecture, every core; cpu in a rehearsal); bench/gpu_check.py's
# checks; bench/gpu_streams.py's table of the GPU's own rates (in a rehearsal, the CPU's).
# A step that needs a GPU where there is none is not run, and said so (exit status 0). A
# step after the build that the rest of CALL_LIMIT cannot hold stops the run: the work,
# the build above all, is kept in $HOME/.cache/mrunner-gpu-work, outside the checkout
# (which a new call's copy replaces), so the same command run again on the same machine
# finds the build and goes straight to the checks (GPU_DEVICE_SKIP="checks" leaves out
# steps already done; STREAMS_SHAPES="1:1000,64:1000,256:1000" asks for other streams).
# OUT receives steps.txt (each step's seconds against its expected ones), the checks'
# table.txt and results.json, the rates' streams.txt and streams.json, and logs.tar.gz.
set -uo pipefail

# Each step: whether it needs a GPU (yes, no, or for the variant named: cuda, to know the
# build's architecture and to measure on it) and its expected seconds on the lent H200 (16
# cores): the build's, the wheels' and the model's as it took them (346.5, 6.3, 0.1);
# prepare's as here; the checks' from what they start and ask (seven daemons, SmolLM2
# loaded some eleven times, 256 tokens at ~700 tokens/s); the rates' as bench/gpu_streams.py
# sizes them. 541 s in all: 49 s to spare in a 590 s call.
STEPS="wheels:no:7 model:no:1 prepare:no:6 build:cuda:347 checks:yes:100 streams:cuda:80"
if [ "${1:-}" = --steps ]; then
	for step in $STEPS; do
		IFS=: read -r name gpu expected <<<"$step"
		echo "$name gpu=$gpu expected=${expected}s"
	done
	exit 0
fi

OUT=${1:?usage: bench/gpu_device.sh OUT}
REPO=$(pwd)
BUNDLE=${BUNDLE:-$REPO/.gpu-bundle}
VARIANT=${GPU_DEVICE_VARIANT:-cuda}
PYTHON=${PYTHON:-python3}
#: The whole run's seconds (a lent machine's call: 10 minutes), and those kept for packing the logs.
CALL_LIMIT=${CALL_LIMIT:-590}
PACKING=5
STARTED=$EPOCHREALTIME
# Kept between runs, outside the checkout (a lent machine keeps it while warm): a finished build
# is found there again, so a run whose build took most of its time can be followed by one that checks.
WORK=${GPU_DEVICE_WORK:-$HOME/.cache/mrunner-gpu-work}
LOGS=$WORK/logs
rm -rf "$LOGS" "$WORK/home"
mkdir -p "$OUT" "$LOGS"
[ -f "$BUNDLE/manifest.json" ] || { echo "gpu-device: no bundle at $BUNDLE: run make gpu-bundle" >&2; exit 2; }

# Only the bundle: no index, no configured find-links or constraints of this machine.
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_FIND_LINKS=$BUNDLE/wheels PIP_DISABLE_PIP_VERSION_CHECK=1
unset PIP_CONSTRAINT PIP_INDEX_URL PIP_EXTRA_INDEX_URL CUDAARCHS
export PYTHONUNBUFFERED=1 MRUNNER_HOME=$WORK/home XDG_CACHE_HOME=$WORK/cache
export PATH="$WORK/site/bin:$PATH:/usr/local/cuda/bin"

finish() {
	printf '%-8s %7.1f %9s  of %s\n' total "$(awk "BEGIN { print $EPOCHREALTIME - $STARTED }")" \
		"$EXPECTED" "$CALL_LIMIT" >>"$OUT/steps.txt"
	# The daemons' stores and the layouts are SmolLM2's zeros: left out.
	tar -czf "$OUT/logs.tar.gz" --exclude=blobs --exclude='*.gguf' -C "$WORK" logs 2>/dev/null
	cat "$OUT/table.txt" "$OUT/streams.txt" 2>/dev/null
	echo "gpu-device: steps (seconds):"
	cat "$OUT/steps.txt"
}

# record NAME SECONDS STATUS: a line of steps.txt, with the step's expected seconds.
record() {
	printf '%-8s %7s %9s  %s\n' "$1" "$2" "$(expected "$1")" "$3" >>"$OUT/steps.txt"
}

expected() {
	local step
	for step in $STEPS; do [ "${step%%:*}" = "$1" ] && echo "${step##*:}"; done
}

# step NAME COMMAND...: run it with its output in logs/NAME.log, its time in steps.txt.
step() {
	local name=$1 began rc
	shift
	echo "gpu-device: $name ..."
	began=$EPOCHREALTIME
	"$@" >"$LOGS/$name.log" 2>&1
	rc=$?
	record "$name" "$(awk "BEGIN { printf \"%.1f\", $EPOCHREALTIME - $began }")" \
		"$([ $rc = 0 ] && echo ok || echo "failed ($rc)")"
	if [ $rc != 0 ]; then
		echo "gpu-device: $name failed ($rc); the end of logs/$name.log:"
		tail -n 30 "$LOGS/$name.log"
	fi
	return $rc
}

# has_gpu STEP: whether an NVIDIA GPU is here; where none is, STEP is recorded as not run.
has_gpu() {
	nvidia-smi -L >/dev/null 2>&1 && return 0
	echo "gpu-device: no NVIDIA GPU here (nvidia-smi does not answer): '$1' not run."
	record "$1" - "not run: no GPU"
	return 1
}

wheels() {
	if "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
		"$PYTHON" -m pip install --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" "$BUNDLE"/wheels/*.whl &&
			PYTHONPATH="$WORK/site" "$PYTHON" -c 'import twisted, klein, treq, gguf, httpx2; print("imports ok")'
	else
		echo "$("$PYTHON" -V) here: resolving the bundle for CPython 3.12, not installing it"
		"$PYTHON" -c 'import twisted, klein, gguf, httpx2, packaging' 2>/dev/null ||
			{ echo "and $PYTHON lacks mrunner's packages: give PYTHON=a CPython 3.12" >&2; return 1; }
		"$PYTHON" -m bench.gpu_bundle --resolve "$BUNDLE"
	fi
}

model() {
	local size
	size=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["smollm2"]["size"])' "$BUNDLE/manifest.json")
	cp "$BUNDLE/smollm2.head" "$WORK/smollm2.gguf" && truncate -s "$size" "$WORK/smollm2.gguf" &&
		echo "SmolLM2's layout, zero weights: $WORK/smollm2.gguf, $size bytes"
}

# The build's tools, the sdist from the bundle and CMake's configure, for the CPU, offline.
prepare() {
	"${OFFLINE[@]}" "$PYTHON" -m bench.gpu_prepare "$WORK/prepare"
}

# mrunner's own build of VARIANT from the bundle's sdist, with no network where that can be
# enforced (a network namespace of its own), its wall and CPU seconds in logs/build.log.
build() {
	if [ "$VARIANT" = cuda ]; then
		# The GPU's architecture, as mrunner will pass it to CMake (a build for every architecture
		# llama.cpp lists takes seven times longer).
		"$PYTHON" -c 'from mrunner.backends.cuda import capabilities; from mrunner.devices.nvml import Nvml
import subprocess; smi = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
    capture_output=True, text=True).stdout.splitlines(); caps = capabilities(Nvml.load(), smi)
print("architectures:", caps); raise SystemExit(0 if caps else "no compute capability found: refusing to build for all")' || return 1
	fi
	TIMEFORMAT="build: %R s wall, %U s user, %S s system (CPU seconds: user + system)"
	time timeout "$(left)" "${OFFLINE[@]}" "$PYTHON" -m mrunner.backends.llamacpp --variant="$VARIANT"
}

# left: whole seconds of CALL_LIMIT not yet spent.
left() {
	awk "BEGIN { print int($CALL_LIMIT - ($EPOCHREALTIME - $STARTED)) }"
}

# enough_time STEP: stop (status 0) when fewer seconds are left than STEP is expected to take,
# saying how to go on.
enough_time() {
	if [ "$(left)" -lt "$(expected "$1")" ]; then
		echo "gpu-device: $(left) s left of $CALL_LIMIT, and '$1' takes some $(expected "$1"): the build is" \
			"kept in $WORK; run the same command again (on a lent machine: at once, while it is warm)," \
			"with GPU_DEVICE_SKIP naming the steps done."
		record "$1" - "not run: $(left) s left"
		exit "$FAILED"
	fi
}

# limited COMMAND...: COMMAND, stopped by SIGTERM (which the bench unwinds, stopping what it started)
# when only the seconds for packing the logs are left.
limited() {
	timeout -s TERM "$(($(left) - PACKING))" "$@"
}

server() {
	"$PYTHON" -c 'import sys; from mrunner.backends.llamacpp.source import cached_executable
print(cached_executable(variant=sys.argv[1]))' "$VARIANT"
}

checks() {
	MRUNNER_CUDA_LLAMA_SERVER=$(server) limited "$PYTHON" -m bench.gpu_check --gguf "$WORK/smollm2.gguf" \
		--out "$OUT" --logs "$LOGS"
}

# The GPU's rates; in a rehearsal (GPU_DEVICE_VARIANT=cpu) the same on the CPU build, a few streams.
streams() {
	local cpu=()
	[ "$VARIANT" = cpu ] && cpu=(--cpu)
	limited "$PYTHON" -m bench.gpu_streams "${cpu[@]}" --server "$(server)" --gguf "$WORK/smollm2.gguf" \
		--out "$OUT" --logs "$LOGS/streams" ${STREAMS_SHAPES:+--shapes "$STREAMS_SHAPES"}
}

EXPECTED=0
for entry in $STEPS; do EXPECTED=$((EXPECTED + ${entry##*:})); done
OFFLINE=()
unshare -n true 2>/dev/null && OFFLINE=(unshare -n)
printf '%-8s %7s %9s  %s\n' "# step" seconds expected \
	"status (expected: the build, wheels and model as the first lent H200 took them; the rest estimated)" \
	>"$OUT/steps.txt"
trap finish EXIT
export PYTHONPATH="$REPO:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
# After the build a failed step does not stop the next: the run's status says one failed.
FAILED=0
for entry in $STEPS; do
	IFS=: read -r name gpu _ <<<"$entry"
	case " ${GPU_DEVICE_SKIP:-} " in *" $name "*)
		record "$name" - "skipped (GPU_DEVICE_SKIP)"
		continue
		;;
	esac
	if [ "$gpu" = yes ] || [ "$gpu" = "$VARIANT" ]; then has_gpu "$name" || continue; fi
	case $name in checks | streams) enough_time "$name" ;; esac
	if ! step "$name" "$name"; then
		case $name in checks | streams) FAILED=1 ;; *) exit 1 ;; esac
	fi
done
exit $FAILED
