"""The Jupyter side: restarting this kernel, what a kernel starts with, policy files, kernelspecs."""
