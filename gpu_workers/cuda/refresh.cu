// The harness's own kernel (trusted, never a writer's): fresh inputs before every timed
// call. It overwrites one input array of the pool with rows drawn at random, with
// replacement, from a reservoir of `sets` copies of that array (each generated on the host
// from the problem's own distribution). Row r of the result is row src of reservoir set s,
// where h = mix64(key + r), s = h % sets, src = mix64(h) % rows: gpu_workers/cuda/fresh.py
// computes the same on the host (refresh_on_host), and the keys.
// Data moves in 16-bit units, so one kernel serves 2- and 4-byte elements.
#include <stdint.h>

__host__ __device__ __forceinline__ uint64_t kf_mix64(uint64_t x) {
    uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The reservoir unit that unit `u` of the result is copied from.
__host__ __device__ __forceinline__ uint64_t kf_refresh_source(uint64_t u, uint64_t rows,
                                                               uint64_t row_units,
                                                               uint64_t sets, uint64_t key) {
    const uint64_t r = u / row_units;
    const uint64_t j = u - r * row_units;
    const uint64_t h = kf_mix64(key + r);
    const uint64_t s = h % sets;
    const uint64_t src = kf_mix64(h) % rows;
    return (s * rows + src) * row_units + j;
}

extern "C" __global__ void kf_refresh(uint16_t *dst, const uint16_t *reservoir, uint64_t rows,
                                      uint64_t row_units, uint64_t sets, uint64_t key) {
    const uint64_t total = rows * row_units;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += stride)
        dst[u] = reservoir[kf_refresh_source(u, rows, row_units, sets, key)];
}
