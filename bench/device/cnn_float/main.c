/* float32 C training of the W3 digits-cnn on the device: the yardstick for tinytrain's integer step.
 *
 * Exactly the layers of tinytrain/models.py `digits-cnn` and of its PyTorch twin
 * (tinytrain/lab/twins.py w3_twin), channels-last:
 *   8x8x1 -> Conv2d(8, 3x3, same) -> BatchNorm -> ReLU -> MaxPool 2x2 -> 4x4x8
 *         -> Conv2d(16, 3x3, same) -> BatchNorm -> ReLU -> MaxPool 2x2 -> 2x2x16
 *         -> Flatten (H, W, C) -> Dense(10) -> softmax cross-entropy.
 * BatchNorm in train mode at batch 1: mean and biased variance over the sample's H*W positions,
 * eps 1e-5; the running mean/variance (unbiased) follow with momentum 1/8 and are used only for
 * the test pass. Full backward (batch-norm backward through the batch statistics, max-pool to
 * the first maximum of each window, no input gradient for the first convolution), plain SGD
 * lr 0.03, batch 1: each sample's gradient is applied at once, every parameter's gradient
 * complete before it changes (no gradient buffer: an error is propagated before its layer's
 * weights are updated).
 *
 * float_data.h (written by bench/bench_device.py) holds the first TT_FLOAT_N training digits,
 * TT_FLOAT_NTEST test digits (pixels 0..16, scaled here to [0, 1], the twin's inputs) and the
 * initial weights: tinytrain's own He-uniform draws from np.random.default_rng(0) (the twin's
 * too), biases 0, gamma 1, beta 0. Soft-float on Cortex-M0/M3 (newlib's __aeabi_f*, expf, logf,
 * sqrtf), the FPU on M4F/M7 (hard-float ABI from the board).
 *
 * The program trains TT_FLOAT_EPOCHS passes over the samples, reads tt_port_cycles() around each
 * pass (the training steps only; the sum is kept in 64 bits), then runs the test digits through
 * the trained network (eval mode, untimed) and prints one line
 *   float32 samples=<n> instructions=<total> per_sample=<total / n> correct=<c> loss_mQ=<l>
 *           loss_first_mQ=<l0> test_correct=<t> test_n=<TT_FLOAT_NTEST>
 * (correct: training predictions during the last pass; loss_mQ / loss_first_mQ: training loss
 * summed over the last / first pass, in thousandths), then exits 0. With -DTT_FLOAT_TRACE every
 * training step also prints "loss_uQ=<loss in millionths>" (bench/device/cnn_float/check_host.py
 * compares those with the PyTorch twin on the host).
 */
#include <math.h>
#include <stdint.h>

#include "float_data.h"
#include "tt_port.h"

#ifndef TT_FLOAT_EPOCHS
#define TT_FLOAT_EPOCHS 2
#endif

enum { N0 = 8, C0 = 1, F1 = 8, N1 = 4, F2 = 16, N2 = 2, NF = N2 * N2 * F2, NO = 10 };

#define LR 0.03f
#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.125f

typedef struct {
    float gamma, beta, run_mean, run_var;
} bn_param;

/* Parameters (initialised from float_data.h). Conv weights (filters, KH, KW, C), Dense (out, in). */
static float w1[F1][3][3][C0], b1[F1], w2[F2][3][3][F1], b2[F2], w3[NO][NF], b3[NO];
static bn_param bn1[F1], bn2[F2];

/* Activations kept for the backward pass. */
static float z1[N0 * N0 * F1], xh1[N0 * N0 * F1], p1[N1 * N1 * F1];
static float z2[N1 * N1 * F2], xh2[N1 * N1 * F2], p2[NF];
static float inv1[F1], inv2[F2];
static uint8_t arg1[N1 * N1 * F1], arg2[NF]; /* pooled position -> index of its max in the window */
static float xs[TT_FLOAT_N][N0 * N0 * C0];

/* 3x3 'same' convolution (one pixel of zero padding each side), stride 1, n x n x c -> n x n x f. */
static void conv3_forward(const float *x, int n, int c, const float *w, const float *b, int f, float *z)
{
    int oy, ox, o, ky, kx, i;
    for (oy = 0; oy < n; oy++)
        for (ox = 0; ox < n; ox++)
            for (o = 0; o < f; o++) {
                float s = b[o];
                for (ky = 0; ky < 3; ky++) {
                    const int iy = oy + ky - 1;
                    if (iy < 0 || iy >= n) continue;
                    for (kx = 0; kx < 3; kx++) {
                        const int ix = ox + kx - 1;
                        const float *xp = x + (iy * n + ix) * c, *wp = w + ((o * 3 + ky) * 3 + kx) * c;
                        if (ix < 0 || ix >= n) continue;
                        for (i = 0; i < c; i++) s += wp[i] * xp[i];
                    }
                }
                z[(oy * n + ox) * f + o] = s;
            }
}

/* dx = conv^T(dz) with the current weights (dx: n x n x c, zeroed here). */
static void conv3_input_grad(const float *dz, int n, int c, const float *w, int f, float *dx)
{
    int oy, ox, o, ky, kx, i;
    for (i = 0; i < n * n * c; i++) dx[i] = 0.0f;
    for (oy = 0; oy < n; oy++)
        for (ox = 0; ox < n; ox++)
            for (o = 0; o < f; o++) {
                const float g = dz[(oy * n + ox) * f + o];
                for (ky = 0; ky < 3; ky++) {
                    const int iy = oy + ky - 1;
                    if (iy < 0 || iy >= n) continue;
                    for (kx = 0; kx < 3; kx++) {
                        const int ix = ox + kx - 1;
                        float *dp = dx + (iy * n + ix) * c;
                        const float *wp = w + ((o * 3 + ky) * 3 + kx) * c;
                        if (ix < 0 || ix >= n) continue;
                        for (i = 0; i < c; i++) dp[i] += wp[i] * g;
                    }
                }
            }
}

/* SGD on the convolution: each weight's gradient summed over the positions, then applied. */
static void conv3_update(const float *dz, const float *x, int n, int c, float *w, float *b, int f)
{
    int o, ky, kx, i, oy, ox;
    for (o = 0; o < f; o++) {
        float gb = 0.0f;
        for (oy = 0; oy < n * n; oy++) gb += dz[oy * f + o];
        b[o] -= LR * gb;
        for (ky = 0; ky < 3; ky++)
            for (kx = 0; kx < 3; kx++)
                for (i = 0; i < c; i++) {
                    float g = 0.0f;
                    for (oy = 0; oy < n; oy++) {
                        const int iy = oy + ky - 1;
                        if (iy < 0 || iy >= n) continue;
                        for (ox = 0; ox < n; ox++) {
                            const int ix = ox + kx - 1;
                            if (ix < 0 || ix >= n) continue;
                            g += dz[(oy * n + ox) * f + o] * x[(iy * n + ix) * c + i];
                        }
                    }
                    w[((o * 3 + ky) * 3 + kx) * c + i] -= LR * g;
                }
    }
}

/* Batch norm over the m positions of z (m x f) in train mode (batch statistics; xh and inv kept
 * for the backward pass, running statistics updated) or eval mode (running statistics), then
 * ReLU and 2x2 max pooling of the n x n map (pool: (n/2) x (n/2) x f, arg: window index 0..3 of
 * the first maximum, ties to the first as PyTorch). */
static void bn_relu_pool(float *z, int n, int f, bn_param *bn, float *xh, float *inv, float *pool,
                         uint8_t *arg, int train)
{
    const int m = n * n, h = n / 2;
    int c, p, py, px, k;
    for (c = 0; c < f; c++) {
        float mean, var, s = 0.0f, q = 0.0f, r;
        if (train) {
            for (p = 0; p < m; p++) s += z[p * f + c];
            mean = s / (float)m;
            for (p = 0; p < m; p++) {
                const float d = z[p * f + c] - mean;
                q += d * d;
            }
            var = q / (float)m;
            bn[c].run_mean += BN_MOMENTUM * (mean - bn[c].run_mean);
            bn[c].run_var += BN_MOMENTUM * (q / (float)(m - 1) - bn[c].run_var);
        } else {
            mean = bn[c].run_mean;
            var = bn[c].run_var;
        }
        r = 1.0f / sqrtf(var + BN_EPS);
        inv[c] = r;
        for (p = 0; p < m; p++) {
            const float x = (z[p * f + c] - mean) * r;
            const float y = bn[c].gamma * x + bn[c].beta;
            xh[p * f + c] = x;
            z[p * f + c] = y > 0.0f ? y : 0.0f; /* z now holds the ReLU output */
        }
    }
    for (py = 0; py < h; py++)
        for (px = 0; px < h; px++)
            for (c = 0; c < f; c++) {
                const float *a = z + ((2 * py) * n + 2 * px) * f + c;
                const float v[4] = {a[0], a[f], a[n * f], a[n * f + f]};
                int best = 0;
                for (k = 1; k < 4; k++)
                    if (v[k] > v[best]) best = k;
                pool[(py * h + px) * f + c] = v[best];
                arg[(py * h + px) * f + c] = (uint8_t)best;
            }
}

/* From d(pool) to d(conv output): un-pool to the max, ReLU mask (z holds the ReLU output), batch
 * norm backward through the batch statistics; gamma and beta updated. dz: n x n x f, written. */
static void bn_relu_pool_backward(const float *dpool, const uint8_t *arg, const float *z, const float *xh,
                                  const float *inv, int n, int f, bn_param *bn, float *dz)
{
    const int m = n * n, h = n / 2;
    int c, p, py, px;
    for (p = 0; p < m * f; p++) dz[p] = 0.0f;
    for (py = 0; py < h; py++)
        for (px = 0; px < h; px++)
            for (c = 0; c < f; c++) {
                const int k = arg[(py * h + px) * f + c];
                const int at = ((2 * py + (k >> 1)) * n + 2 * px + (k & 1)) * f + c;
                if (z[at] > 0.0f) dz[at] = dpool[(py * h + px) * f + c];
            }
    for (c = 0; c < f; c++) {
        float sdy = 0.0f, sdyx = 0.0f, k;
        for (p = 0; p < m; p++) {
            sdy += dz[p * f + c];
            sdyx += dz[p * f + c] * xh[p * f + c];
        }
        /* dz = gamma * inv / m * (m * dy - sum dy - xhat * sum dy*xhat) */
        k = bn[c].gamma * inv[c] / (float)m;
        for (p = 0; p < m; p++) dz[p * f + c] = k * ((float)m * dz[p * f + c] - sdy - xh[p * f + c] * sdyx);
        bn[c].gamma -= LR * sdyx;
        bn[c].beta -= LR * sdy;
    }
}

/* Forward to the logits (train: batch statistics, else running statistics). */
static void forward(const float *x, float *logits, int train)
{
    int k, j;
    conv3_forward(x, N0, C0, &w1[0][0][0][0], b1, F1, z1);
    bn_relu_pool(z1, N0, F1, bn1, xh1, inv1, p1, arg1, train);
    conv3_forward(p1, N1, F1, &w2[0][0][0][0], b2, F2, z2);
    bn_relu_pool(z2, N1, F2, bn2, xh2, inv2, p2, arg2, train);
    for (k = 0; k < NO; k++) {
        float s = b3[k];
        for (j = 0; j < NF; j++) s += w3[k][j] * p2[j];
        logits[k] = s;
    }
}

static int argmax(const float *v, int n)
{
    int k, a = 0;
    for (k = 1; k < n; k++)
        if (v[k] > v[a]) a = k;
    return a;
}

/* One SGD step on sample x with label y; returns 1 if the prediction was right, adds the loss. */
static int train_step(const float *x, int y, float *loss)
{
    static float dz1[N0 * N0 * F1], dp1[N1 * N1 * F1], dz2[N1 * N1 * F2];
    float z[NO], e[NO], dp2[NF], zmax, sum = 0.0f, l;
    int j, k, arg;
    forward(x, z, 1);
    arg = argmax(z, NO);
    zmax = z[arg];
    for (k = 0; k < NO; k++) {
        e[k] = expf(z[k] - zmax);
        sum += e[k];
    }
    l = logf(sum) - (z[y] - zmax);
    *loss += l;
#ifdef TT_FLOAT_TRACE
    tt_port_puts("loss_uQ=");
    tt_port_putu32((uint32_t)(l * 1e6f + 0.5f));
    tt_port_puts("\r\n");
#endif
    for (k = 0; k < NO; k++) e[k] = e[k] / sum - (k == y ? 1.0f : 0.0f);
    /* Dense: error to the features first, then the update. */
    for (j = 0; j < NF; j++) {
        float s = 0.0f;
        for (k = 0; k < NO; k++) s += w3[k][j] * e[k];
        dp2[j] = s;
    }
    for (k = 0; k < NO; k++) {
        const float g = LR * e[k];
        for (j = 0; j < NF; j++) w3[k][j] -= g * p2[j];
        b3[k] -= g;
    }
    bn_relu_pool_backward(dp2, arg2, z2, xh2, inv2, N1, F2, bn2, dz2);
    conv3_input_grad(dz2, N1, F1, &w2[0][0][0][0], F2, dp1);
    conv3_update(dz2, p1, N1, F1, &w2[0][0][0][0], b2, F2);
    bn_relu_pool_backward(dp1, arg1, z1, xh1, inv1, N0, F1, bn1, dz1);
    conv3_update(dz1, x, N0, C0, &w1[0][0][0][0], b1, F1);
    return arg == y;
}

static void init_params(void)
{
    int i, c;
    const float *src = tt_float_init_w1;
    for (i = 0; i < F1 * 9 * C0; i++) (&w1[0][0][0][0])[i] = src[i];
    src = tt_float_init_w2;
    for (i = 0; i < F2 * 9 * F1; i++) (&w2[0][0][0][0])[i] = src[i];
    src = tt_float_init_w3;
    for (i = 0; i < NO * NF; i++) (&w3[0][0])[i] = src[i];
    for (c = 0; c < F1; c++) bn1[c] = (bn_param){1.0f, 0.0f, 0.0f, 1.0f};
    for (c = 0; c < F2; c++) bn2[c] = (bn_param){1.0f, 0.0f, 0.0f, 1.0f};
    /* biases: static storage, already 0 */
}

static void put_u64(uint64_t v)
{
    char buf[21];
    int n = 0;
    do {
        buf[n++] = (char)('0' + (int)(v % 10u));
        v /= 10u;
    } while (v);
    while (n) tt_port_putc((uint8_t)buf[--n]);
}

int main(void)
{
    uint64_t total = 0;
    uint32_t n = 0, t0;
    int i, j, ep, correct = 0, test_correct = 0;
    float loss = 0.0f, loss_first = 0.0f, x[N0 * N0 * C0], logits[NO];
    tt_port_init();
    init_params();
    for (j = 0; j < TT_FLOAT_N; j++)
        for (i = 0; i < N0 * N0 * C0; i++) xs[j][i] = (float)tt_float_pixels[j][i] / 16.0f;
    for (ep = 0; ep < TT_FLOAT_EPOCHS; ep++) {
        correct = 0;
        loss = 0.0f;
        t0 = tt_port_cycles();
        for (j = 0; j < TT_FLOAT_N; j++, n++) correct += train_step(xs[j], tt_float_labels[j], &loss);
        total += (uint32_t)(tt_port_cycles() - t0);
        if (ep == 0) loss_first = loss;
    }
    for (j = 0; j < TT_FLOAT_NTEST; j++) {
        for (i = 0; i < N0 * N0 * C0; i++) x[i] = (float)tt_float_test_pixels[j][i] / 16.0f;
        forward(x, logits, 0);
        test_correct += argmax(logits, NO) == tt_float_test_labels[j];
    }
    tt_port_puts("float32 samples=");
    tt_port_putu32(n);
    tt_port_puts(" instructions=");
    put_u64(total);
    tt_port_puts(" per_sample=");
    put_u64(total / n);
    tt_port_puts(" correct=");
    tt_port_putu32((uint32_t)correct);
    tt_port_puts(" loss_mQ=");
    tt_port_putu32((uint32_t)(loss * 1000.0f));
    tt_port_puts(" loss_first_mQ=");
    tt_port_putu32((uint32_t)(loss_first * 1000.0f));
    tt_port_puts(" test_correct=");
    tt_port_putu32((uint32_t)test_correct);
    tt_port_puts(" test_n=");
    tt_port_putu32(TT_FLOAT_NTEST);
    tt_port_puts("\r\n");
    tt_port_exit(0);
    return 0;
}
