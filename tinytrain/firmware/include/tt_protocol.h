/**
 * tt_protocol.h — the device side of the tinytrain serial protocol (docs/protocol.md).
 *
 * Frame (before COBS, little-endian), sent on the wire as 0x00, COBS bytes, 0x00, 0x00:
 *   u8 version | u8 type | u16 seq | u8 flags | u8 reserved | u16 len | u32 schema |
 *   payload[len] | u32 crc32(everything before it)
 * A tt_proto owns three buffers (rx, tx, aux); no heap, no float.
 */
#ifndef TT_PROTOCOL_H
#define TT_PROTOCOL_H

#include <stdint.h>
#include "tt_cobs.h"
#include "tt_device.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TT_PROTO_VERSION 1u
#ifndef TT_FW_VERSION
#define TT_FW_VERSION 0x00000100u /* 0.1.0 as (major << 16) | (minor << 8) | patch */
#endif
#ifndef TT_MAX_PAYLOAD
#define TT_MAX_PAYLOAD 256u /* small enough for any MCU to buffer twice; HELLO reports it */
#endif
#define TT_HDR_LEN 12u
#define TT_CRC_LEN 4u
#define TT_FRAME_MAX (TT_HDR_LEN + TT_MAX_PAYLOAD + TT_CRC_LEN)
#define TT_LOG_MAX 64u
#define TT_AUX_MAX (TT_HDR_LEN + 8u + TT_LOG_MAX + TT_CRC_LEN)

/** Message types. Replies are the request type | TT_MSG_REPLY; LOG and ERROR come from the device. */
enum tt_msg {
    TT_MSG_HELLO = 0x01,
    TT_MSG_LOAD_STATUS = 0x02,
    TT_MSG_LOAD_PARAMS = 0x03,
    TT_MSG_LOAD_COMMIT = 0x04,
    TT_MSG_TRAIN = 0x05,
    TT_MSG_TRAIN_BATCH = 0x06,
    TT_MSG_PREDICT = 0x07,
    TT_MSG_STATE_HASH = 0x08,
    TT_MSG_GET_TENSOR = 0x09,
    TT_MSG_SET_SEED = 0x0A,
    TT_MSG_RESET = 0x0B,
    TT_MSG_ROUND_BEGIN = 0x0C,  /* optional: federated update codec on the device */
    TT_MSG_GET_UPDATE = 0x0D,
    TT_MSG_UPDATE_ACK = 0x0E,
    TT_MSG_FED_PROX = 0x0F,     /* optional: FedProx's pull toward the ROUND_BEGIN snapshot */
    TT_MSG_REPLY = 0x80,
    TT_MSG_LOG = 0xC0,
    TT_MSG_ERROR = 0xFF
};

/** Header flags (device to host). */
enum tt_flag {
    TT_FLAG_UNSOLICITED = 0x01, /* not a reply: LOG, boot HELLO */
    TT_FLAG_BOOT = 0x02,        /* the HELLO sent once after every device reset */
    TT_FLAG_REPLAY = 0x04       /* repeated reply to a retransmitted request (not re-executed) */
};

/** How the protocol reaches the outside world (tt_device_main.c wires tt_port_*). */
typedef struct tt_proto_io {
    tt_cobs_put_fn put;         /* write one byte to the link */
    uint32_t (*cycles)(void *ctx); /* free-running counter; may be NULL (cycles reported as 0) */
    void *ctx;
} tt_proto_io;

/** Protocol state. Fields are private; allocate statically. */
typedef struct tt_proto {
    const tt_device_model *m;
    tt_proto_io io;
    tt_cobs_decoder dec;
    uint8_t rx[TT_FRAME_MAX];
    uint8_t tx[TT_FRAME_MAX]; /* the last reply, kept to answer a retransmission */
    uint8_t aux[TT_AUX_MAX];  /* LOG frames and errors for frames that failed their CRC */
    uint32_t tx_len;
    uint32_t last_crc;        /* CRC of the last executed request */
    uint16_t last_seq;
    uint8_t last_type;
    uint8_t have_last;
    uint32_t load_next;       /* bytes of the parameter blob staged so far */
    uint32_t load_crc;        /* CRC-32 of those bytes */
} tt_proto;

/** Initialise (no output). */
void tt_proto_init(tt_proto *p, const tt_device_model *m, const tt_proto_io *io);
/** Emit the unsolicited boot HELLO (preceded by a 0x00 so the host's decoder resyncs). */
void tt_proto_send_boot(tt_proto *p);
/** Feed one received byte; a completed frame is executed and answered before this returns.
 *  Returns 1 if this byte ended a frame (answered, or rejected with an ERROR frame), else 0. */
int tt_proto_feed(tt_proto *p, uint8_t byte);
/** Emit a LOG frame with the NUL-terminated text (truncated to TT_LOG_MAX bytes). */
void tt_proto_log(tt_proto *p, const char *text);

#ifdef __cplusplus
}
#endif

#endif /* TT_PROTOCOL_H */
