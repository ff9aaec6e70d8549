"""The CUDA templates (`*.cu.j2` beside this file) and their design spaces.

Every template renders one source for the cuda target: device code only, with the
`// kf-launch:` lines of `kernels.cuda_launch` saying how to run it, for elements of the
campaign's dtype, fp32, bf16 or fp16 (`T` in the templates: float, __nv_bfloat16 or
__half, `kernels.design_space.CUDA_TYPES`), with fp32 arithmetic.
"""

from __future__ import annotations

from kernels.cuda_templates.matmul import MATMUL_TEMPLATES
from kernels.cuda_templates.rows import ROW_TEMPLATES
from kernels.design_space import Template

CUDA_TEMPLATES: tuple[Template, ...] = (*ROW_TEMPLATES, *MATMUL_TEMPLATES)
