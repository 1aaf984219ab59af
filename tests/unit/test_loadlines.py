"""Reading a llama-server's load output: each device's buffers, and which device ran out."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from mrunner.backends.loadlines import MIB, LoadReport

#: As the pinned build logs them at ``-lv 4`` (the CPU lines copied from a real load of SmolLM2).
LOAD = [
    "0.01.220.370 I load_tensors:   CPU_Mapped model buffer size =    92.10 MiB",
    "0.01.220.371 I load_tensors:        CUDA0 model buffer size =  1000.00 MiB",
    "0.01.220.372 I load_tensors:        CUDA1 model buffer size =   500.50 MiB",
    "0.01.222.429 I llama_context:        CPU  output buffer size =     0.75 MiB",
    "0.01.222.562 I llama_kv_cache:      CUDA0 KV buffer size =    45.00 MiB",
    "0.01.350.588 I sched_reserve:       CUDA0 compute buffer size =    15.51 MiB",
    "0.01.350.589 I sched_reserve:   CUDA_Host compute buffer size =     4.00 MiB",
    "0.01.350.590 I srv  load_model: initializing, n_slots = 4",
]


class LoadReportTests(SynchronousTestCase):
    def test_buffers_per_device(self) -> None:
        report = LoadReport()
        report.read(LOAD)
        self.assertEqual(
            report.buffers,
            {
                "CPU": round(92.10 * MIB) + round(0.75 * MIB) + 4 * MIB,
                "CUDA0": 1000 * MIB + 45 * MIB + round(15.51 * MIB),
                "CUDA1": round(500.5 * MIB),
            },
        )
        self.assertIsNone(report.out_of_memory)

    def test_out_of_memory(self) -> None:
        """The first line that says a device ran out names it, in each backend's words."""
        cases = [
            (
                "ggml_backend_cuda_buffer_type_alloc_buffer:"
                " allocating 9.0 MiB on device 1: cudaMalloc failed: out of memory",
                "CUDA1",
            ),
            ("alloc_tensor_range: failed to allocate ROCm0 buffer of size 1234", "ROCm0"),
            (
                "ggml_vulkan: Device memory allocation of size 1234 failed."
                " vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
                "Vulkan",
            ),
            (
                "ggml_backend_cuda_buffer_type_alloc_buffer:"
                " allocating 9.0 MiB on device 0: hipMalloc failed: out of memory",
                "ROCm0",
            ),
        ]
        for line, device in cases:
            report = LoadReport()
            report.read(["llama_model_load: loading", line, "failed to allocate CUDA3 buffer"])
            self.assertEqual(report.out_of_memory, device, line)
