"""The machine's GPUs: the NVML inventory, `CUDA_VISIBLE_DEVICES` as CUDA reads it, the doctor."""
