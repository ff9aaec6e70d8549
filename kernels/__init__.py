"""Problems and kernel templates; imports nothing else of Kernel Factory.

spec           what a problem is (reference, inputs, signature, tolerances, cost)
shape_rules    derived dims and constraints between dims (small integer expressions)
builtin        the built-in problem library (BUILTIN)
loading        load_problem("softmax") or load_problem("my_ops.py:NAME"), checked at load
design_space   what a design space and a Template are (params, constraints, render)
templates      the registry of every target's templates (TEMPLATES, templates_for), the
               cpu ones with their jinja2 files in cpu_templates/; the example kernels
cuda_templates the CUDA templates (jinja2 files beside their design spaces)
cuda_launch    how a CUDA source declares its launches and scratch buffers (kf-launch lines)
fusion         graph problems: op IR, partitions, C and CUDA generated from it, the fusion space
examples/      the best hand-tuned cpu kernel of each problem, rendered from its template
"""
