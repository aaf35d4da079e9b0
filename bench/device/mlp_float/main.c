/* float32 C training of the W1 MLP on the device: the yardstick for tinytrain's integer step.
 *
 * 64-32-10 MLP, ReLU, softmax cross-entropy, plain SGD with batch 1 (each sample's gradient is
 * applied at once, no gradient buffer: W2's error is propagated before W2 is updated), lr 0.05,
 * He-uniform init from xorshift32 -- the arithmetic of bench/c/mlp_float.c at batch 1, written
 * the way one would for a microcontroller. Soft-float on Cortex-M0/M3 (newlib's __aeabi_f* and
 * expf), the FPU on M4F/M7 (hard-float ABI from the board).
 *
 * The samples are the first TT_FLOAT_N training digits in float_data.h (written by
 * bench/bench_device.py: pixels 0..16 and labels), scaled to [0, 1] before timing. The program
 * trains TT_FLOAT_EPOCHS passes over them, reads tt_port_cycles() around the whole training loop
 * only, and prints
 *   float32 samples=<n> instructions=<total> per_sample=<total / n> correct=<c> loss_mQ=<l>
 * (correct: training-set predictions during the last pass; loss in thousandths, summed over the
 * last pass, integer-printed so that no printf float support is needed), then exits 0.
 */
#include <math.h>
#include <stdint.h>

#include "float_data.h"
#include "tt_port.h"

#ifndef TT_FLOAT_EPOCHS
#define TT_FLOAT_EPOCHS 2
#endif

enum { NI = 64, NH = 32, NO = 10 };

static float w1[NH][NI], b1[NH], w2[NO][NH], b2[NO];
static float xs[TT_FLOAT_N][NI];
static uint32_t rng_state = 2654435761u;

static uint32_t xorshift32(void)
{
    uint32_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return rng_state = x;
}

static float uniform_pm(float bound)
{
    return bound * (2.0f * (float)(xorshift32() >> 8) / 16777216.0f - 1.0f);
}

/* One SGD step on sample x with label y; returns 1 if the prediction was right, adds the loss. */
static int train_step(const float *x, int y, float lr, float *loss)
{
    float h[NH], z[NO], e2[NO], e1[NH], zmax, sum = 0.0f;
    int i, j, k, arg = 0;
    for (j = 0; j < NH; j++) {
        float s = b1[j];
        for (i = 0; i < NI; i++) s += w1[j][i] * x[i];
        h[j] = s > 0.0f ? s : 0.0f;
    }
    for (k = 0; k < NO; k++) {
        float s = b2[k];
        for (j = 0; j < NH; j++) s += w2[k][j] * h[j];
        z[k] = s;
        if (s > z[arg]) arg = k;
    }
    zmax = z[arg];
    for (k = 0; k < NO; k++) {
        e2[k] = expf(z[k] - zmax);
        sum += e2[k];
    }
    *loss += logf(sum) - (z[y] - zmax);
    for (k = 0; k < NO; k++) e2[k] = e2[k] / sum - (k == y ? 1.0f : 0.0f);
    for (j = 0; j < NH; j++) {
        float s = 0.0f;
        if (h[j] > 0.0f)
            for (k = 0; k < NO; k++) s += w2[k][j] * e2[k];
        e1[j] = s;
    }
    for (k = 0; k < NO; k++) {
        const float g = lr * e2[k];
        for (j = 0; j < NH; j++) w2[k][j] -= g * h[j];
        b2[k] -= g;
    }
    for (j = 0; j < NH; j++) {
        const float g = lr * e1[j];
        if (g == 0.0f) continue; /* inactive unit: nothing to apply */
        for (i = 0; i < NI; i++) w1[j][i] -= g * x[i];
        b1[j] -= g;
    }
    return arg == y;
}

int main(void)
{
    const float bound1 = sqrtf(6.0f / NI), bound2 = sqrtf(6.0f / NH);
    uint32_t t0, t1, n = 0;
    int i, j, ep, correct = 0;
    float loss = 0.0f;
    tt_port_init();
    for (j = 0; j < NH; j++)
        for (i = 0; i < NI; i++) w1[j][i] = uniform_pm(bound1);
    for (j = 0; j < NO; j++)
        for (i = 0; i < NH; i++) w2[j][i] = uniform_pm(bound2);
    for (j = 0; j < TT_FLOAT_N; j++)
        for (i = 0; i < NI; i++) xs[j][i] = (float)tt_float_pixels[j][i] / 16.0f;
    t0 = tt_port_cycles();
    for (ep = 0; ep < TT_FLOAT_EPOCHS; ep++) {
        correct = 0;
        loss = 0.0f;
        for (j = 0; j < TT_FLOAT_N; j++, n++) correct += train_step(xs[j], tt_float_labels[j], 0.05f, &loss);
    }
    t1 = tt_port_cycles();
    tt_port_puts("float32 samples=");
    tt_port_putu32(n);
    tt_port_puts(" instructions=");
    tt_port_putu32(t1 - t0);
    tt_port_puts(" per_sample=");
    tt_port_putu32((t1 - t0) / n);
    tt_port_puts(" correct=");
    tt_port_putu32((uint32_t)correct);
    tt_port_puts(" loss_mQ=");
    tt_port_putu32((uint32_t)(loss * 1000.0f));
    tt_port_puts("\r\n");
    tt_port_exit(0);
    return 0;
}
