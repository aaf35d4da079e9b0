/** Plain float32 C training of the W1 MLP (64-32-10, ReLU, softmax CE, SGD): the speed baseline.
 *
 * Usage: mlp_float DATA EPOCHS BATCH LR SEED
 * DATA is written by bench/bench_speed.py: int32 header (n_train, n_test, n_in, n_classes),
 * then float32 x_train (n_train*n_in), int32 y_train, float32 x_test, int32 y_test.
 * Init: He-uniform weights in +-sqrt(6/fan_in), zero biases.  Each epoch visits the training set
 * in a fresh Fisher-Yates order (xorshift32).  BATCH > 1 accumulates gradients and applies their
 * mean after BATCH samples (and after the last, shorter batch of an epoch).
 * Prints one line: "samples_per_s=<f> seconds=<f> samples=<n> test_acc=<f>"; only the training
 * loop is timed (CLOCK_MONOTONIC).  No SIMD intrinsics and no BLAS: what gcc -O2 makes of loops.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NI = 64, NH = 32, NO = 10 };

static uint32_t rng_state;

static uint32_t xorshift32(void) {
    uint32_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return rng_state = x;
}

static float uniform_pm(float bound) { /* uniform in [-bound, bound) */
    return bound * (2.0f * (float)(xorshift32() >> 8) / 16777216.0f - 1.0f);
}

typedef struct {
    float w1[NH][NI], b1[NH], w2[NO][NH], b2[NO];
} Params;

/* Forward pass; h holds the post-ReLU hidden layer, p the softmax probabilities. */
static int forward(const Params *P, const float *x, float *h, float *p) {
    for (int j = 0; j < NH; j++) {
        float s = P->b1[j];
        for (int i = 0; i < NI; i++) s += P->w1[j][i] * x[i];
        h[j] = s > 0.0f ? s : 0.0f;
    }
    float z[NO], zmax = -INFINITY;
    int arg = 0;
    for (int k = 0; k < NO; k++) {
        float s = P->b2[k];
        for (int j = 0; j < NH; j++) s += P->w2[k][j] * h[j];
        z[k] = s;
        if (s > zmax) { zmax = s; arg = k; }
    }
    float sum = 0.0f;
    for (int k = 0; k < NO; k++) { p[k] = expf(z[k] - zmax); sum += p[k]; }
    for (int k = 0; k < NO; k++) p[k] /= sum;
    return arg;
}

/* Adds the gradient of the CE loss on one sample to G (G must be zeroed by the caller). */
static void backward(const Params *P, const float *x, const float *h, const float *p, int label, Params *G) {
    float e2[NO], e1[NH];
    for (int k = 0; k < NO; k++) e2[k] = p[k] - (k == label ? 1.0f : 0.0f);
    for (int j = 0; j < NH; j++) {
        float s = 0.0f;
        for (int k = 0; k < NO; k++) s += P->w2[k][j] * e2[k];
        e1[j] = h[j] > 0.0f ? s : 0.0f;
    }
    for (int k = 0; k < NO; k++) {
        for (int j = 0; j < NH; j++) G->w2[k][j] += e2[k] * h[j];
        G->b2[k] += e2[k];
    }
    for (int j = 0; j < NH; j++) {
        for (int i = 0; i < NI; i++) G->w1[j][i] += e1[j] * x[i];
        G->b1[j] += e1[j];
    }
}

static void apply(Params *P, Params *G, float step) { /* P -= step * G; G = 0 */
    float *p = (float *)P, *g = (float *)G;
    for (size_t i = 0; i < sizeof(Params) / sizeof(float); i++) { p[i] -= step * g[i]; g[i] = 0.0f; }
}

static void *read_all(FILE *f, size_t n, const char *what) {
    void *buf = malloc(n ? n : 1);
    if (!buf || fread(buf, 1, n, f) != n) { fprintf(stderr, "mlp_float: short read of %s\n", what); exit(2); }
    return buf;
}

int main(int argc, char **argv) {
    if (argc != 6) { fprintf(stderr, "usage: %s DATA EPOCHS BATCH LR SEED\n", argv[0]); return 2; }
    int epochs = atoi(argv[2]), batch = atoi(argv[3]);
    float lr = strtof(argv[4], NULL);
    rng_state = (uint32_t)strtoul(argv[5], NULL, 10) * 2654435761u + 1u;
    if (!rng_state) rng_state = 1;
    FILE *f = fopen(argv[1], "rb");
    if (!f) { perror(argv[1]); return 2; }
    int32_t hdr[4];
    if (fread(hdr, sizeof hdr, 1, f) != 1 || hdr[2] != NI || hdr[3] != NO) {
        fprintf(stderr, "mlp_float: %s is not a %dx%d data file\n", argv[1], NI, NO);
        return 2;
    }
    int ntr = hdr[0], nte = hdr[1];
    float *xtr = read_all(f, sizeof(float) * ntr * NI, "x_train");
    int32_t *ytr = read_all(f, sizeof(int32_t) * ntr, "y_train");
    float *xte = read_all(f, sizeof(float) * nte * NI, "x_test");
    int32_t *yte = read_all(f, sizeof(int32_t) * nte, "y_test");
    fclose(f);

    static Params P, G;
    float b1 = sqrtf(6.0f / NI), b2 = sqrtf(6.0f / NH);
    for (int j = 0; j < NH; j++) for (int i = 0; i < NI; i++) P.w1[j][i] = uniform_pm(b1);
    for (int k = 0; k < NO; k++) for (int j = 0; j < NH; j++) P.w2[k][j] = uniform_pm(b2);
    int *order = malloc(sizeof(int) * ntr);
    for (int i = 0; i < ntr; i++) order[i] = i;
    float h[NH], p[NO];

    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int ep = 0; ep < epochs; ep++) {
        for (int i = ntr - 1; i > 0; i--) {
            int j = (int)(((uint64_t)xorshift32() * (uint64_t)(i + 1)) >> 32), t = order[i];
            order[i] = order[j]; order[j] = t;
        }
        int in_batch = 0;
        for (int s = 0; s < ntr; s++) {
            const float *x = xtr + (size_t)order[s] * NI;
            forward(&P, x, h, p);
            backward(&P, x, h, p, ytr[order[s]], &G);
            if (++in_batch == batch || s == ntr - 1) { apply(&P, &G, lr / in_batch); in_batch = 0; }
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);

    int correct = 0;
    for (int s = 0; s < nte; s++) correct += forward(&P, xte + (size_t)s * NI, h, p) == yte[s];
    long n = (long)epochs * ntr;
    printf("samples_per_s=%.1f seconds=%.6f samples=%ld test_acc=%.4f\n", n / sec, sec, n,
           nte ? (double)correct / nte : 0.0);
    return 0;
}
