"""`python -m tfgpu_magic selftest`: proof, on the machine it runs on, that each rule of a policy really
takes effect with the TensorFlow, JAX, PyTorch and GPUs installed there.

Each rule runs in a fresh Python process (this interpreter, this environment), applies one policy
through the public API and measures the outcome (`probes`: the child scripts; `measure`: what they
read of the GPUs); `rules` says what each rule expects and judges it; `run` runs the processes, in
parallel where they can be; `report` holds the verdicts and their JSON (`views.selftest` words them).
docs/selftest.md describes every rule. This package never imports TensorFlow, JAX or PyTorch: only its
child processes do.
"""
