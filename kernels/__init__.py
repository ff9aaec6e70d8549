"""Problems and kernel templates; imports nothing else of Kernel Factory.

spec       what a problem is (reference, inputs, signature, tolerances, cost)
builtin    the built-in problem library (BUILTIN)
loading    load_problem("softmax") or load_problem("my_ops.py:NAME")
templates  jinja2 kernel templates and their design spaces (TEMPLATES, templates_for)
examples/  the best hand-tuned kernel of each problem, rendered from its template
"""
