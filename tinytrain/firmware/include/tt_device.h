/**
 * tt_device.h — what the serial protocol needs from a trainable model on the device.
 *
 * The generated model code fills one tt_device_model (usually a const in flash) and the board's
 * main() calls tt_port_init() then tt_device_run(&model) (blocking), or the application calls
 * tt_device_begin(&model) once and tt_device_poll() from its own loop (non-blocking). All hooks are plain functions over the
 * model's static state: no heap, no float. A NULL hook makes the matching command answer
 * TT_ERR_UNSUPPORTED. Hooks return 0 on success or a TT_ERR_* code; on error they must leave the
 * model state unchanged.
 */
#ifndef TT_DEVICE_H
#define TT_DEVICE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Error codes on the wire (ERROR frames) and from model hooks. Values are protocol-stable. */
enum tt_err {
    TT_OK = 0,
    TT_ERR_CRC = 1,             /* frame CRC-32 mismatch */
    TT_ERR_FRAMING = 2,         /* malformed COBS or frame shorter than header + CRC */
    TT_ERR_LENGTH = 3,          /* length field != received payload, or wrong size for command */
    TT_ERR_TOO_LONG = 4,        /* frame longer than the device's receive buffer */
    TT_ERR_UNKNOWN_CMD = 5,     /* message type not known to this firmware */
    TT_ERR_VERSION = 6,         /* protocol version byte not supported */
    TT_ERR_SCHEMA = 7,          /* request names a model schema hash the device does not run */
    TT_ERR_SEQUENCE = 8,        /* LOAD_PARAMS offset not contiguous (detail = expected offset) */
    TT_ERR_BUSY = 9,            /* device cannot do this now (e.g. staging uses scratch RAM) */
    TT_ERR_RANGE = 10,          /* label, tensor id, offset or length out of range */
    TT_ERR_BLOB_CRC = 11,       /* LOAD_COMMIT: CRC of the staged blob != CRC sent by host */
    TT_ERR_LOAD_INCOMPLETE = 12,/* LOAD_COMMIT before every byte of the blob was staged */
    TT_ERR_UNSUPPORTED = 13,    /* the model does not implement this command */
    TT_ERR_MODEL = 14           /* a model hook failed (detail = its return code) */
};

/** GET_TENSOR id for the whole flat parameter/state blob (the LOAD_PARAMS layout). */
#define TT_TENSOR_PARAMS 0xFFFFu

typedef struct tt_device_model {
    uint32_t schema_hash; /* hash of the graph schema the firmware was generated from; never 0 */
    uint32_t ram_bytes;   /* static RAM used by the model (tensors, optimizer, scratch) */
    uint32_t param_bytes; /* size of the flat little-endian parameter/state blob */
    uint16_t input_len;   /* int8 values per sample */
    uint16_t n_classes;   /* labels are 0..n_classes-1 */

    /** One training step on sample x[input_len] with label in [0, n_classes). *loss_out is the
     *  model's fixed-point loss. */
    int (*train_step)(const int8_t *x, int32_t label, int32_t *loss_out);
    /** Predicted class of x[input_len]; does not change state (nor the PRNG). */
    int32_t (*predict)(const int8_t *x);
    /** Hash over parameters, optimizer state, PRNG state and step counter; equals the host's. */
    uint32_t (*state_hash)(void);
    /** Training steps done since reset / load. */
    uint32_t (*step_count)(void);
    /** Copy blob bytes [offset, offset+n) of the LIVE state into dst; the protocol clips n. */
    int (*read_params)(uint32_t offset, uint8_t *dst, uint32_t n);
    /**
     * Atomic load, part 1: write blob bytes [offset, offset+n) into a shadow copy; the live state
     * must not change. Called with contiguous, increasing offsets starting at 0 (offset 0 again
     * starts over). Where RAM has no room for a full shadow, a model may stage into scratch
     * buffers that training also uses and answer TT_ERR_BUSY from train_step meanwhile.
     */
    int (*stage_params)(uint32_t offset, const uint8_t *src, uint32_t n);
    /** Atomic load, part 2: make the shadow live. Only called once all param_bytes are staged and
     *  their CRC-32 matched the host's; must not fail half-way. */
    int (*commit_params)(void);
    /**
     * Tensor `id` (numbering given by the schema): set *total_len to its size in bytes, then copy
     * bytes [offset, offset + min(n, total_len - offset)) into dst. offset > total_len:
     * TT_ERR_RANGE; unknown id: TT_ERR_RANGE.
     */
    int (*get_tensor)(uint16_t id, uint32_t offset, uint8_t *dst, uint32_t n, uint32_t *total_len);
    /** Seed the model's PRNG (stochastic rounding, shuffling, dropout). */
    void (*set_seed)(uint32_t seed);
    /** Back to the initial parameters, step 0, initial PRNG state. */
    void (*reset)(void);

    /* ---- Optional: the federated update codec on the device (tt_fedcodec.h). Models built
     * without it leave these NULL (or omit them): ROUND_BEGIN, GET_UPDATE and UPDATE_ACK then
     * answer TT_ERR_UNSUPPORTED and the host compresses on its side of the link. ---- */
    /** ROUND_BEGIN: snapshot the live parameter store as this round's global model and select
     *  the codec (1 int8, 2 int4, 3 sign, 8 signmv; 0 snapshot only; else TT_ERR_RANGE). *global_hash = CRC-32 of the
     *  snapshot, *residual_crc = CRC-32 of the error-feedback residual (int64 LE). */
    int (*round_begin)(uint32_t round, uint32_t device, uint32_t codec, uint32_t *global_hash,
                       uint32_t *residual_crc);
    /** GET_UPDATE at offset 0: encode the round's update message from the live state (with
     *  n_samples in its header); *len = its bytes, *crc = its trailing CRC-32. */
    int (*update_prepare)(uint32_t n_samples, uint32_t *len, uint32_t *crc);
    /** Bytes [offset, offset + min(n, *len - offset)) of the prepared message into dst; *len and
     *  *crc as update_prepare gave them. Nothing prepared: TT_ERR_SEQUENCE; offset > *len:
     *  TT_ERR_RANGE. */
    int (*update_read)(uint32_t offset, uint8_t *dst, uint32_t n, uint32_t *len, uint32_t *crc);
    /** UPDATE_ACK: the coordinator's verdict; commits the residual only if accepted and the live
     *  state still encodes to the message with CRC `crc`. *status: 0 residual kept, 1 committed,
     *  2 round already closed; *residual_crc as in round_begin. */
    int (*update_ack)(uint32_t round, uint32_t crc, uint32_t accepted, uint32_t *status,
                      uint32_t *residual_crc);
    /** Optional FED_PROX: FedProx's pull of the live parameter store toward the ROUND_BEGIN
     *  snapshot, w -= rshift_round((w - g) * mult, shift) (tt_fedcodec_prox). NULL: UNSUPPORTED. */
    int (*fed_prox)(uint32_t mult, uint32_t shift);
    /** Bits of the on-device error-feedback residual (64, 32 or 16; 0: unknown = 64), reported in
     *  HELLO's flags. */
    uint32_t fed_residual_bits;
} tt_device_model;

/**
 * The device main loop: announce with an unsolicited boot HELLO, then read bytes with
 * tt_port_getc() and answer frames, forever. Call tt_port_init() first. Returns only if
 * tt_port_getc() returns a negative value (host test ports use this to close the link).
 */
int tt_device_run(const tt_device_model *m);

/**
 * The same link without giving up the CPU, for an application that owns its main loop (an
 * Arduino sketch's loop(), a superloop, an RTOS task). tt_device_begin: call once after
 * tt_port_init(); sends the boot HELLO. tt_device_poll: reads only the bytes already waiting
 * (tt_port_trygetc) and returns after answering at most one request: 1 if a frame was answered
 * (or rejected with an ERROR frame), 0 if the bytes ran out first (a partial frame is kept for
 * the next call), -1 if tt_device_begin was not called. Its longest call is one frame's bytes
 * plus one request (a TRAIN_BATCH request trains its whole batch). The application's own calls
 * into the model (<prefix>_train_step ...) must not run inside a poll: they are between polls,
 * which is the case in a single-threaded loop.
 */
void tt_device_begin(const tt_device_model *m);
int tt_device_poll(void);

/** Send a LOG frame (text, truncated to TT_LOG_MAX bytes) once tt_device_begin (or
 *  tt_device_run) has started the link; before that, nothing is sent. */
void tt_device_log(const char *text);

#ifdef __cplusplus
}
#endif

#endif /* TT_DEVICE_H */
