/**
 * tt_fedcodec.h — the federated update codec on the device: the C twin of
 * tinytrain/federated/codec.py (`compress` + `encode_update`), bit for bit.
 *
 * Per stored tensor of the model's parameter store (int8 / int16 / int32, little-endian, at a
 * known offset of the state blob), with g the global store snapshotted at ROUND_BEGIN, x the
 * live value after local training and r the error-feedback residual (int64):
 *
 *   v = (x - g) + r
 *   int8/int4: s = max(0, bitwidth(max|v|) - (bits - 1)), q = clamp(rshift_round(v, s), ±(2^(bits-1) - 1))
 *              (rshift_round: nearest, ties toward +inf); int4 nibbles two's complement, element 2k
 *              in the low nibble of byte k, a last odd element's high nibble 0
 *   sign, signmv: m = floor(sum|v| / max(n, 1)); m == 0: shift 255 ("zero", no data) and q = 0;
 *              else s = bitwidth(m) - 1, bit k of byte k/8 (LSB first) = (v >= 0)
 *   d = q * 2^s, reconstructed y = sat(g + d) (int8 ±127, int16 ±32767, int32 full range),
 *   new residual r' = v - (y - g), committed only by tt_fedcodec_ack(accepted = 1); kept in int64,
 *   or narrowed to int32 / int16 (residual_width 4 / 2 at init) by saturation to the width's
 *   two's-complement range, as codec.compress(residual_bits=32/16) does.
 *
 * The update message (docs/federated.md), little-endian:
 *   u8 1 | u8 codec | u16 0 | u32 device | u32 round | u32 n_samples | u32 hash | u32 step |
 *   u16 n_tensors | per tensor: u8 shift, data | u32 crc32(everything before)
 * with hash = CRC-32 of the reconstructed store (y, schema order, LE). The message is never held
 * in RAM: tt_fedcodec_read() regenerates any byte range from (x, g, r, shifts).
 *
 * Range contract (as the Python side, which computes in numpy int64): |v| < 2^62 and
 * sum|v| < 2^63 per tensor. Training moves parameters by far less; the residual is bounded by
 * one quantization step plus what saturation of y held back.
 *
 * FedProx's proximal pull (tinytrain/federated/prox.py, the reference), between local steps:
 *   w' = w - rshift_round((w - g) * mult, shift)   per element of the store, int64, mult < 2^15,
 * the result between g and w (the coefficient mult * 2^-shift < 1), so no saturation; chunks whose
 * elements do not move are not written (frozen parameters in flash stay untouched).
 *
 * RAM (caller-provided, static): store bytes for g, 8 (4, 2) bytes per stored element for r, one byte
 * per tensor for the shifts, and sizeof(tt_fedcodec). C99, no heap, no float, <stdint.h> and
 * <string.h> only (plus tt_crc32). Functions return 0 or a tt_err code (tt_device.h).
 */
#ifndef TT_FEDCODEC_H
#define TT_FEDCODEC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Codec numbers: the index in tinytrain.federated.codec.CODECS (0 = none: no codec). */
enum tt_fed_codec { TT_FED_NONE = 0, TT_FED_INT8 = 1, TT_FED_INT4 = 2, TT_FED_SIGN = 3,
                    TT_FED_SIGNMV = 8 /* sign, aggregated by majority vote: encoded as SIGN */ };

#define TT_FED_VERSION 1u
#define TT_FED_HEADER_BYTES 26u
#define TT_FED_ZERO_SHIFT 255u

/** ACK outcomes (tt_fedcodec_ack *status). */
enum tt_fed_ack { TT_FED_KEPT = 0, TT_FED_COMMITTED = 1, TT_FED_CLOSED = 2 };

/** Reads bytes [off, off + n) of the live state blob; 0 on success (the generated
 *  <prefix>_read_state has this signature). */
typedef int (*tt_fed_read_fn)(uint32_t off, uint8_t *dst, uint32_t n);
/** Writes bytes [off, off + n) of the live state blob; 0 on success (<prefix>_write_state). */
typedef int (*tt_fed_write_fn)(uint32_t off, const uint8_t *src, uint32_t n);

/** One tensor of the parameter store. */
typedef struct tt_fed_tensor {
    uint32_t offset; /* byte offset in the state blob */
    uint32_t count;  /* elements */
    uint32_t width;  /* bytes per element: 1 (int8), 2 (int16) or 4 (int32) */
} tt_fed_tensor;

/** Codec state. Fields are private; allocate statically. */
typedef struct tt_fedcodec {
    const tt_fed_tensor *t;
    uint32_t n_tensors;
    tt_fed_read_fn read;
    uint8_t *global;   /* store snapshot, tt_fedcodec_store_bytes() bytes */
    void *residual;    /* tt_fedcodec_n_params() elements of res_width bytes (int64/32/16) */
    uint8_t *shift;    /* n_tensors bytes */
    uint32_t codec, res_codec, round, device, n_samples, step;
    uint32_t hash, crc, msg_len;
    uint8_t open;      /* a round began and was not acknowledged yet */
    uint8_t prepared;  /* shift, hash, crc, msg_len describe the current message */
    uint8_t res_width; /* bytes per residual element: 8, 4 or 2 */
    uint32_t res_saturated; /* residual elements saturated to res_width since init */
} tt_fedcodec;

/** Bytes of the parameter store (the snapshot buffer's size). */
uint32_t tt_fedcodec_store_bytes(const tt_fed_tensor *t, uint32_t n_tensors);
/** Elements of the parameter store (the residual buffer's length). */
uint32_t tt_fedcodec_n_params(const tt_fed_tensor *t, uint32_t n_tensors);

/** Bind the buffers; the residual (residual_width bytes per element: 8 int64, 4 int32 or 2
 *  int16, suitably aligned; anything else means 8) starts at zero. */
void tt_fedcodec_init(tt_fedcodec *c, const tt_fed_tensor *t, uint32_t n_tensors, tt_fed_read_fn read,
                      uint8_t *global, void *residual, uint32_t residual_width, uint8_t *shift);

/** Residual elements saturated to the residual's width since init (always 0 for int64). */
uint32_t tt_fedcodec_residual_saturations(const tt_fedcodec *c);

/**
 * Start a round: snapshot the global store from the live state (call right after loading the
 * global model) and select the codec (1..3 or 8; 0: snapshot only, for tt_fedcodec_prox when the
 * host encodes the update; else TT_ERR_RANGE). A codec other than the one the residual was built
 * with zeroes the residual. An open round is abandoned (its residual kept).
 */
int tt_fedcodec_begin(tt_fedcodec *c, uint32_t codec, uint32_t round, uint32_t device);

/** CRC-32 of the snapshot (= the Python store_hash of the global model). */
uint32_t tt_fedcodec_global_hash(const tt_fedcodec *c);
/** CRC-32 of the residual as int64 little-endian, schema order. */
uint32_t tt_fedcodec_residual_crc(const tt_fedcodec *c);

/**
 * Encode the update of the open round from the live state: per-tensor shifts, the hash of the
 * reconstructed store and the message CRC. *len = message bytes (CRC included), *crc = its
 * trailing CRC. Deterministic: calling it again on the same state gives the same message.
 * No open round: TT_ERR_SEQUENCE.
 */
int tt_fedcodec_prepare(tt_fedcodec *c, uint32_t n_samples, uint32_t step, uint32_t *len, uint32_t *crc);

/**
 * FedProx's pull of the live store toward the round's snapshot (the rule above), written through
 * `write`. No open round: TT_ERR_SEQUENCE; mult >= 2^15 or shift > 62: TT_ERR_RANGE. A prepared
 * message no longer describes the live state afterwards (prepare again).
 */
int tt_fedcodec_prox(tt_fedcodec *c, tt_fed_write_fn write, uint32_t mult, uint32_t shift);

/** Bytes [off, off + n) of the prepared message (off + n <= len, else TT_ERR_RANGE). */
int tt_fedcodec_read(const tt_fedcodec *c, uint32_t off, uint8_t *dst, uint32_t n);

/**
 * The coordinator's verdict on the round's update, which closes the round. accepted: the live
 * state must still encode to the message with CRC `crc` (else TT_ERR_BLOB_CRC, nothing
 * committed, round still open); then r = r' (*status TT_FED_COMMITTED). Not accepted: the old
 * residual stays (TT_FED_KEPT). A round already closed: nothing changes (TT_FED_CLOSED).
 * round != the open round: TT_ERR_RANGE. accepted before prepare: TT_ERR_SEQUENCE.
 */
int tt_fedcodec_ack(tt_fedcodec *c, uint32_t round, uint32_t crc, uint32_t accepted, uint32_t *status);

#ifdef __cplusplus
}
#endif

#endif /* TT_FEDCODEC_H */
