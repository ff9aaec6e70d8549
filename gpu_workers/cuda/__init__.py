"""The CUDA target: nvcc builds, ptxas resources and the static stage; the GPU runtime."""
