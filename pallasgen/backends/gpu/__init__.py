"""NVIDIA GPUs: Pallas's Triton backend."""

from __future__ import annotations

from pallasgen.backends.base import Backend
from pallasgen.backends.gpu.checks import check_gpu
from pallasgen.backends.gpu.options import GPU_FUNCTION_LOCALS, gpu_keywords
from pallasgen.backends.gpu.plan import kernel_function_name, keyword_group, launcher_name, plan_gpu


class GpuBackend(Backend):
    name = "gpu"
    template = "gpu.py.j2"

    def check(self, kernel, space, product, blocks, earlier):
        return check_gpu(kernel, space, product, blocks, earlier)

    def keywords(self, checked):
        return keyword_group(checked)

    def reserved_names(self, checked):
        return gpu_keywords(checked.dims) | set(GPU_FUNCTION_LOCALS)

    def function_names(self, kernel):
        return kernel_function_name(kernel), launcher_name(kernel)

    def plan(self, lowered):
        return plan_gpu(lowered)
