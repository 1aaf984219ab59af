"""The machine's devices: GPUs as llama-server lists them, NVML's live view of them, the host's RAM.

It imports nothing of the daemon but the seams' values and the configuration, so the
backends (which read a build's variant from its device list) and the wiring can use it.
"""
