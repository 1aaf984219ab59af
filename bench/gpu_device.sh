#!/usr/bin/env bash
# The GPU check on a bare NVIDIA machine with no package index, from `make gpu-bundle`'s bundle.
#
#   bench/gpu_device.sh OUT        from the repository root, with .gpu-bundle/ beside it
#   bench/gpu_device.sh --steps    the steps, in order, and whether each needs a GPU
#
# Steps: the bundle's wheels into a folder on PYTHONPATH (where the interpreter is not
# CPython 3.12, as in a rehearsal, they are only resolved for it); SmolLM2's layout with
# zero weights; llama-server built by mrunner itself from the bundle's sdist, offline
# (GPU_DEVICE_VARIANT=cuda, the default, for the GPU found: one architecture, every core;
# cpu in a rehearsal); then bench/gpu_check.py's checks. The first step that needs a GPU
# where there is none stops the run, saying so, with exit status 0; so does a build that
# leaves the checks too little of CALL_LIMIT (the build is kept in .gpu-work/: run again).
# OUT receives steps.txt (each step's seconds), the checks' table.txt and results.json,
# and logs.tar.gz.
set -uo pipefail

# Each step, and whether it needs a GPU: yes, no, or for the variant named (cuda: to know its architecture).
STEPS="wheels:no model:no build:cuda checks:yes"
if [ "${1:-}" = --steps ]; then
	for step in $STEPS; do echo "${step%%:*} gpu=${step#*:}"; done
	exit 0
fi

OUT=${1:?usage: bench/gpu_device.sh OUT}
REPO=$(pwd)
BUNDLE=${BUNDLE:-$REPO/.gpu-bundle}
VARIANT=${GPU_DEVICE_VARIANT:-cuda}
PYTHON=${PYTHON:-python3}
#: The whole run's seconds (a lent machine's call: 10 minutes), and the checks' share of them.
CALL_LIMIT=${CALL_LIMIT:-590}
CHECKS_NEED=${CHECKS_NEED:-150}
STARTED=$EPOCHREALTIME
# Kept between runs (ignored by git; a lent machine keeps it while warm): a finished build is
# found there again, so a run whose build took most of its time can be followed by one that checks.
WORK=${GPU_DEVICE_WORK:-$REPO/.gpu-work}
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
	tar -czf "$OUT/logs.tar.gz" -C "$WORK" logs 2>/dev/null
	cat "$OUT/table.txt" 2>/dev/null
	echo "gpu-device: steps (seconds):"
	cat "$OUT/steps.txt"
}
trap finish EXIT

# step NAME COMMAND...: run it with its output in logs/NAME.log, its time in steps.txt.
step() {
	local name=$1 began rc
	shift
	echo "gpu-device: $name ..."
	began=$EPOCHREALTIME
	"$@" >"$LOGS/$name.log" 2>&1
	rc=$?
	printf '%-8s %7.1f  %s\n' "$name" "$(awk "BEGIN { print $EPOCHREALTIME - $began }")" \
		"$([ $rc = 0 ] && echo ok || echo "failed ($rc)")" >>"$OUT/steps.txt"
	if [ $rc != 0 ]; then
		echo "gpu-device: $name failed ($rc); the end of logs/$name.log:"
		tail -n 30 "$LOGS/$name.log"
	fi
	return $rc
}

# needs_gpu STEP: stop (status 0) when there is no NVIDIA GPU here, saying which step needed one.
needs_gpu() {
	if ! nvidia-smi -L >/dev/null 2>&1; then
		echo "gpu-device: no NVIDIA GPU here (nvidia-smi does not answer): stopping before '$1', the first step that needs one."
		printf '%-8s %7s  %s\n' "$1" - "not run: no GPU" >>"$OUT/steps.txt"
		exit 0
	fi
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

# mrunner's own build of VARIANT from the bundle's sdist, with no network where that can be
# enforced (a network namespace of its own), its wall and CPU seconds in logs/build.log.
build() {
	local offline=()
	unshare -n true 2>/dev/null && offline=(unshare -n)
	if [ "$VARIANT" = cuda ]; then
		# The GPU's architecture, as mrunner will pass it to CMake (a build for every architecture
		# llama.cpp lists takes seven times longer).
		"$PYTHON" -c 'from mrunner.backends.cuda import capabilities; from mrunner.devices.nvml import Nvml
import subprocess; smi = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
    capture_output=True, text=True).stdout.splitlines(); caps = capabilities(Nvml.load(), smi)
print("architectures:", caps); raise SystemExit(0 if caps else "no compute capability found: refusing to build for all")' || return 1
	fi
	TIMEFORMAT="build: %R s wall, %U s user, %S s system (CPU seconds: user + system)"
	time timeout "$(left)" "${offline[@]}" "$PYTHON" -m mrunner.backends.llamacpp --variant="$VARIANT"
}

# left: whole seconds of CALL_LIMIT not yet spent.
left() {
	awk "BEGIN { print int($CALL_LIMIT - ($EPOCHREALTIME - $STARTED)) }"
}

# enough_time STEP: stop (status 0) when fewer than CHECKS_NEED seconds are left, saying how to go on.
enough_time() {
	if [ "$(left)" -lt "$CHECKS_NEED" ]; then
		echo "gpu-device: $(left) s left of $CALL_LIMIT, and '$1' needs $CHECKS_NEED: the build is kept in" \
			"$WORK; run the same command again (on a lent machine: at once, while it is warm) for '$1'."
		printf '%-8s %7s  %s\n' "$1" - "not run: no time left" >>"$OUT/steps.txt"
		exit 0
	fi
}

checks() {
	local server
	server=$("$PYTHON" -c 'import sys; from mrunner.backends.llamacpp.source import cached_executable
print(cached_executable(variant=sys.argv[1]))' "$VARIANT")
	MRUNNER_CUDA_LLAMA_SERVER=$server "$PYTHON" -m bench.gpu_check --gguf "$WORK/smollm2.gguf" --out "$OUT" \
		--logs "$LOGS"
}

: >"$OUT/steps.txt"
export PYTHONPATH="$REPO:$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
for entry in $STEPS; do
	name=${entry%%:*} gpu=${entry#*:}
	if [ "$gpu" = yes ] || [ "$gpu" = "$VARIANT" ]; then needs_gpu "$name"; fi
	[ "$name" = checks ] && enough_time "$name"
	step "$name" "$name" || exit 1
done
