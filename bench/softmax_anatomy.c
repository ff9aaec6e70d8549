/* The phases of bench/softmax_hand.c's structure 1, each alone over the whole matrix, for
   bench/softmax_anatomy.py: where a row softmax's time goes on this host. Appended to
   softmax_hand.c (STRUCTURE 1 and an EXP defined before it), so the phases use exactly the
   kernel's own loops. Every phase has the kernel's signature and the kernel's split of
   rows over threads. */

/* read x once (the row max), writing only one float per row */
void phase_read(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) y[r * cols] = row_max(x + r * cols, cols);
}

/* write y once with non-temporal stores, reading nothing */
void phase_write(const float *x, float *y, int64_t rows, int64_t cols) {
    (void)x;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        float *row = y + r * cols;
        const __m256 v = set1((float)r);
        int64_t j = 0;
        if (((uintptr_t)row % 32) == 0)
            for (; j < whole(cols, W); j += W) _mm256_stream_ps(row + j, v);
        for (; j < cols; ++j) row[j] = (float)r;
    }
    _mm_sfence();
}

/* the exp pass over a row that stays in L1: each thread's first row, once per row */
void phase_exp(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel
    {
        float *buf = aligned_alloc(64, ((size_t)cols * sizeof(float) + 63) / 64 * 64);
        float total = 0.0f;
        int first = 1;
        const float *row = x;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            if (first) {
                row = x + r * cols;
                first = 0;
            }
            total += exp_into(row, buf, cols, 1.0f, NULL);
        }
        y[0] = total;
        free(buf);
    }
}

/* read x and the exp pass, writing nothing but the row's sum */
void phase_read_exp(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel
    {
        float *buf = aligned_alloc(64, ((size_t)cols * sizeof(float) + 63) / 64 * 64);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const float *row = x + r * cols;
            y[r * cols] = exp_into(row, buf, cols, row_max(row, cols), NULL);
        }
        free(buf);
    }
}

/* the whole kernel's arithmetic with no memory traffic: each thread runs softmax_row on
   its first row, into a scratch row, once per row (structures 0 and 2: with structure 1
   the non-temporal stores would still go to memory) */
void phase_compute(const float *x, float *y, int64_t rows, int64_t cols) {
#pragma omp parallel
    {
        const size_t bytes = ((size_t)cols * sizeof(float) + 63) / 64 * 64;
        float *buf = aligned_alloc(64, bytes), *out = aligned_alloc(64, bytes);
        int first = 1;
        const float *row = x;
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            if (first) {
                row = x + r * cols;
                first = 0;
            }
            softmax_row(row, out, buf, NULL, cols);
        }
        y[0] = out[0];
        free(buf);
        free(out);
    }
}
