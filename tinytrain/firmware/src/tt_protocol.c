/**
 * Frame parser and command dispatcher of the tinytrain serial protocol (docs/protocol.md).
 *
 * Requests are executed at most once: the reply to the last executed request stays in p->tx and
 * a retransmission (same seq, type and CRC) is answered from there, so the host may retry any
 * command, TRAIN included, without training twice. Requests rejected before execution (bad CRC,
 * version, length, schema, unknown type) are answered from p->aux and leave that cache alone.
 */
#include <string.h>

#include "tt_crc32.h"
#include "tt_protocol.h"

static const char *const tt_err_text[] = {
    "ok", "bad frame crc", "bad framing", "bad length", "frame too long", "unknown command",
    "unsupported protocol version", "schema mismatch", "load offset not contiguous", "busy",
    "out of range", "blob crc mismatch", "load incomplete", "unsupported by model", "model error",
};

static void tt_put_u16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void tt_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t tt_get_u16(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8);
}

static uint32_t tt_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Fill the header of buf (payload already at buf + TT_HDR_LEN) and append the CRC. */
static uint32_t tt_frame_finish(const tt_proto *p, uint8_t *buf, uint32_t type, uint32_t seq,
                                uint32_t flags, uint32_t len)
{
    buf[0] = (uint8_t)TT_PROTO_VERSION;
    buf[1] = (uint8_t)type;
    tt_put_u16(buf + 2, seq);
    buf[4] = (uint8_t)flags;
    buf[5] = 0;
    tt_put_u16(buf + 6, len);
    tt_put_u32(buf + 8, p->m->schema_hash);
    tt_put_u32(buf + TT_HDR_LEN + len, tt_crc32_update(0, buf, TT_HDR_LEN + len));
    return TT_HDR_LEN + len + TT_CRC_LEN;
}

/* 0x00, COBS, 0x00, 0x00. The lead ends any noise on the line before this frame (else it would
 * prefix the frame and spoil it); the spare still ends the frame if noise corrupted the first
 * delimiter, so the host sees a bad frame at once instead of merging it with the next one after
 * a timeout. The host ignores the empty frames between them. */
static void tt_frame_send(const tt_proto *p, const uint8_t *buf, uint32_t n)
{
    p->io.put(p->io.ctx, 0);
    tt_cobs_encode(buf, n, p->io.put, p->io.ctx);
    p->io.put(p->io.ctx, 0);
    p->io.put(p->io.ctx, 0);
}

/* ERROR payload: u16 code | u8 request type | u8 0 | u32 detail | message text. */
static uint32_t tt_error_build(const tt_proto *p, uint8_t *buf, uint32_t seq, uint32_t req_type,
                               uint32_t code, uint32_t detail)
{
    const char *msg = code < sizeof tt_err_text / sizeof tt_err_text[0] ? tt_err_text[code] : "?";
    uint32_t n = (uint32_t)strlen(msg);
    uint8_t *pl = buf + TT_HDR_LEN;
    tt_put_u16(pl, code);
    pl[2] = (uint8_t)req_type;
    pl[3] = 0;
    tt_put_u32(pl + 4, detail);
    memcpy(pl + 8, msg, n); /* every message is shorter than TT_LOG_MAX */
    return tt_frame_finish(p, buf, TT_MSG_ERROR, seq, 0, 8u + n);
}

/* An error about a request that was not executed: sent from aux, the replay cache is kept. */
static void tt_reject(tt_proto *p, uint32_t seq, uint32_t req_type, uint32_t code, uint32_t detail)
{
    tt_frame_send(p, p->aux, tt_error_build(p, p->aux, seq, req_type, code, detail));
}

/* A hook's return code as a wire error: known codes pass through, others become TT_ERR_MODEL. */
static int tt_hook_err(int rc, uint32_t *detail)
{
    if (rc > 0 && rc <= TT_ERR_MODEL) {
        return rc;
    }
    *detail = (uint32_t)rc;
    return TT_ERR_MODEL;
}

typedef struct tt_call {
    const uint8_t *in; /* request payload */
    uint32_t n;        /* its length */
    uint8_t *out;      /* reply payload, TT_MAX_PAYLOAD bytes */
    uint32_t out_len;
    uint32_t detail;   /* ERROR detail word */
} tt_call;

static int tt_cmd_hello(tt_proto *p, tt_call *c)
{
    const tt_device_model *m = p->m;
    c->out[0] = (uint8_t)TT_PROTO_VERSION;
    c->out[1] = (uint8_t)((m->stage_params != NULL && m->commit_params != NULL) |
                          (m->round_begin != NULL && m->update_prepare != NULL &&
                           m->update_read != NULL && m->update_ack != NULL) << 1 |
                          (m->round_begin != NULL && m->fed_prox != NULL) << 2 |
                          /* bits 3-4: residual width, 0 int64, 1 int32, 2 int16 */
                          (m->fed_residual_bits == 32u ? 1 : m->fed_residual_bits == 16u ? 2 : 0) << 3);
    tt_put_u16(c->out + 2, TT_MAX_PAYLOAD);
    tt_put_u32(c->out + 4, TT_FW_VERSION);
    tt_put_u32(c->out + 8, m->schema_hash);
    tt_put_u32(c->out + 12, m->ram_bytes);
    tt_put_u32(c->out + 16, m->param_bytes);
    tt_put_u16(c->out + 20, m->input_len);
    tt_put_u16(c->out + 22, m->n_classes);
    tt_put_u32(c->out + 24, m->step_count != NULL ? m->step_count() : 0u);
    c->out_len = 28;
    return TT_OK;
}

static int tt_cmd_load_status(tt_proto *p, tt_call *c)
{
    if (c->n != 0) {
        return TT_ERR_LENGTH;
    }
    tt_put_u32(c->out, p->load_next);
    tt_put_u32(c->out + 4, p->load_crc);
    tt_put_u32(c->out + 8, p->m->param_bytes);
    c->out_len = 12;
    return TT_OK;
}

static int tt_cmd_load_params(tt_proto *p, tt_call *c)
{
    uint32_t off, n;
    if (p->m->stage_params == NULL || p->m->commit_params == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n <= 4) {
        return TT_ERR_LENGTH;
    }
    off = tt_get_u32(c->in);
    n = c->n - 4;
    if (off > p->m->param_bytes || n > p->m->param_bytes - off) {
        c->detail = p->m->param_bytes;
        return TT_ERR_RANGE;
    }
    if (off == 0) { /* offset 0 always starts a new load */
        p->load_next = 0;
        p->load_crc = 0;
    }
    if (off + n <= p->load_next) {
        /* already staged (the host lost our ack): acknowledge again, do not rewrite */
    } else if (off != p->load_next) {
        c->detail = p->load_next;
        return TT_ERR_SEQUENCE;
    } else {
        int rc = p->m->stage_params(off, c->in + 4, n);
        if (rc != 0) {
            return tt_hook_err(rc, &c->detail);
        }
        p->load_crc = tt_crc32_update(p->load_crc, c->in + 4, n);
        p->load_next = off + n;
    }
    tt_put_u32(c->out, p->load_next);
    c->out_len = 4;
    return TT_OK;
}

static void tt_put_state(const tt_proto *p, tt_call *c)
{
    tt_put_u32(c->out, p->m->step_count != NULL ? p->m->step_count() : 0u);
    tt_put_u32(c->out + 4, p->m->state_hash != NULL ? p->m->state_hash() : 0u);
    c->out_len = 8;
}

static int tt_cmd_load_commit(tt_proto *p, tt_call *c)
{
    int rc;
    if (p->m->stage_params == NULL || p->m->commit_params == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n != 8) {
        return TT_ERR_LENGTH;
    }
    if (tt_get_u32(c->in) != p->m->param_bytes) {
        c->detail = p->m->param_bytes;
        return TT_ERR_LENGTH;
    }
    if (p->load_next != p->m->param_bytes) {
        c->detail = p->load_next;
        return TT_ERR_LOAD_INCOMPLETE;
    }
    if (tt_get_u32(c->in + 4) != p->load_crc) {
        c->detail = p->load_crc;
        p->load_next = 0; /* the staged blob is not the host's: start over */
        p->load_crc = 0;
        return TT_ERR_BLOB_CRC;
    }
    rc = p->m->commit_params();
    if (rc != 0) {
        return tt_hook_err(rc, &c->detail);
    }
    p->load_next = 0;
    p->load_crc = 0;
    tt_put_state(p, c);
    return TT_OK;
}

/* Reply of TRAIN and TRAIN_BATCH: u32 step | u32 state hash | i32 loss | u32 cycles. */
static void tt_put_train(const tt_proto *p, tt_call *c, int32_t loss, uint32_t cycles)
{
    tt_put_state(p, c);
    tt_put_u32(c->out + 8, (uint32_t)loss);
    tt_put_u32(c->out + 12, cycles);
    c->out_len = 16;
}

static uint32_t tt_cycles(const tt_proto *p)
{
    return p->io.cycles != NULL ? p->io.cycles(p->io.ctx) : 0u;
}

static int tt_cmd_train(tt_proto *p, tt_call *c)
{
    const tt_device_model *m = p->m;
    uint32_t label, t0, t1;
    int32_t loss = 0;
    int rc;
    if (m->train_step == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n != 2u + m->input_len) {
        c->detail = 2u + m->input_len;
        return TT_ERR_LENGTH;
    }
    label = tt_get_u16(c->in);
    if (label >= m->n_classes) {
        c->detail = label;
        return TT_ERR_RANGE;
    }
    t0 = tt_cycles(p);
    rc = m->train_step((const int8_t *)(c->in + 2), (int32_t)label, &loss);
    t1 = tt_cycles(p);
    if (rc != 0) {
        return tt_hook_err(rc, &c->detail);
    }
    tt_put_train(p, c, loss, t1 - t0);
    return TT_OK;
}

/* u16 count | count x u16 label | count x input_len int8. Labels are all checked first; if a
 * step fails, the steps before it stay applied and detail is the failing sample's index. */
static int tt_cmd_train_batch(tt_proto *p, tt_call *c)
{
    const tt_device_model *m = p->m;
    uint32_t count, i, cycles = 0;
    int64_t loss_sum = 0;
    if (m->train_step == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n < 2) {
        return TT_ERR_LENGTH;
    }
    count = tt_get_u16(c->in);
    if (count == 0 || count > TT_MAX_PAYLOAD || c->n != 2u + count * (2u + m->input_len)) {
        return TT_ERR_LENGTH;
    }
    for (i = 0; i < count; i++) {
        if (tt_get_u16(c->in + 2 + 2 * i) >= m->n_classes) {
            c->detail = i;
            return TT_ERR_RANGE;
        }
    }
    for (i = 0; i < count; i++) {
        const uint8_t *x = c->in + 2u + 2u * count + i * m->input_len;
        int32_t loss = 0;
        uint32_t t0 = tt_cycles(p);
        int rc = m->train_step((const int8_t *)x, (int32_t)tt_get_u16(c->in + 2 + 2 * i), &loss);
        cycles += tt_cycles(p) - t0;
        if (rc != 0) {
            int code = tt_hook_err(rc, &c->detail);
            c->detail = i;
            return code;
        }
        loss_sum += loss;
    }
    if (loss_sum > INT32_MAX) {
        loss_sum = INT32_MAX;
    } else if (loss_sum < INT32_MIN) {
        loss_sum = INT32_MIN;
    }
    tt_put_train(p, c, (int32_t)loss_sum, cycles);
    return TT_OK;
}

static int tt_cmd_predict(tt_proto *p, tt_call *c)
{
    if (p->m->predict == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n != p->m->input_len) {
        c->detail = p->m->input_len;
        return TT_ERR_LENGTH;
    }
    tt_put_u32(c->out, (uint32_t)p->m->predict((const int8_t *)c->in));
    c->out_len = 4;
    return TT_OK;
}

static int tt_cmd_state_hash(tt_proto *p, tt_call *c)
{
    if (c->n != 0) {
        return TT_ERR_LENGTH;
    }
    tt_put_state(p, c);
    return TT_OK;
}

/* u16 id | u16 max bytes | u32 offset  ->  u32 total | u32 offset | data */
static int tt_cmd_get_tensor(tt_proto *p, tt_call *c)
{
    const tt_device_model *m = p->m;
    uint32_t id, cap, off, total = 0, n;
    int rc;
    if (c->n != 8) {
        return TT_ERR_LENGTH;
    }
    id = tt_get_u16(c->in);
    cap = tt_get_u16(c->in + 2);
    off = tt_get_u32(c->in + 4);
    if (cap > TT_MAX_PAYLOAD - 8u) {
        cap = TT_MAX_PAYLOAD - 8u;
    }
    if (id == TT_TENSOR_PARAMS) {
        if (m->read_params == NULL) {
            return TT_ERR_UNSUPPORTED;
        }
        total = m->param_bytes;
        if (off > total) {
            c->detail = total;
            return TT_ERR_RANGE;
        }
        n = total - off < cap ? total - off : cap;
        rc = m->read_params(off, c->out + 8, n);
    } else {
        if (m->get_tensor == NULL) {
            return TT_ERR_UNSUPPORTED;
        }
        rc = m->get_tensor((uint16_t)id, off, c->out + 8, cap, &total);
        if (rc == 0 && off > total) {
            rc = TT_ERR_RANGE;
        }
        n = (rc == 0 && total - off < cap) ? total - off : cap;
    }
    if (rc != 0) {
        return tt_hook_err(rc, &c->detail);
    }
    tt_put_u32(c->out, total);
    tt_put_u32(c->out + 4, off);
    c->out_len = 8u + n;
    return TT_OK;
}

static int tt_cmd_set_seed(tt_proto *p, tt_call *c)
{
    if (p->m->set_seed == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n != 4) {
        return TT_ERR_LENGTH;
    }
    p->m->set_seed(tt_get_u32(c->in));
    c->out_len = 0;
    return TT_OK;
}

static int tt_cmd_reset(tt_proto *p, tt_call *c)
{
    if (p->m->reset == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n != 0) {
        return TT_ERR_LENGTH;
    }
    p->m->reset();
    p->load_next = 0;
    p->load_crc = 0;
    tt_put_state(p, c);
    return TT_OK;
}

/* u32 round | u32 device | u8 codec | 3 x u8 0  ->  u32 step | u32 state hash | u32 global
 * hash | u32 residual CRC */
static int tt_cmd_round_begin(tt_proto *p, tt_call *c)
{
    uint32_t gh = 0, rc32 = 0;
    int rc;
    if (p->m->round_begin == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n != 12) {
        c->detail = 12;
        return TT_ERR_LENGTH;
    }
    /* 0: snapshot only (FED_PROX with the update encoded by the host); 8: signmv */
    if (c->in[8] > 3u && c->in[8] != 8u) {
        c->detail = c->in[8];
        return TT_ERR_RANGE;
    }
    rc = p->m->round_begin(tt_get_u32(c->in), tt_get_u32(c->in + 4), c->in[8], &gh, &rc32);
    if (rc != 0) {
        return tt_hook_err(rc, &c->detail);
    }
    tt_put_state(p, c);
    tt_put_u32(c->out + 8, gh);
    tt_put_u32(c->out + 12, rc32);
    c->out_len = 16;
    return TT_OK;
}

/* u32 n_samples | u32 offset | u16 max bytes | u16 0  ->  u32 total | u32 crc | u32 offset | data.
 * Offset 0 encodes the update from the live state; later offsets read that same message. */
static int tt_cmd_get_update(tt_proto *p, tt_call *c)
{
    const tt_device_model *m = p->m;
    uint32_t off, cap, total = 0, crc = 0, n;
    int rc = 0;
    if (m->update_prepare == NULL || m->update_read == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n != 12) {
        c->detail = 12;
        return TT_ERR_LENGTH;
    }
    off = tt_get_u32(c->in + 4);
    cap = tt_get_u16(c->in + 8);
    if (cap > TT_MAX_PAYLOAD - 12u) {
        cap = TT_MAX_PAYLOAD - 12u;
    }
    if (off == 0) {
        rc = m->update_prepare(tt_get_u32(c->in), &total, &crc);
    }
    if (rc == 0) {
        rc = m->update_read(off, c->out + 12, cap, &total, &crc);
    }
    if (rc == 0 && off > total) {
        c->detail = total;
        rc = TT_ERR_RANGE;
    }
    if (rc != 0) {
        return tt_hook_err(rc, &c->detail);
    }
    n = total - off < cap ? total - off : cap;
    tt_put_u32(c->out, total);
    tt_put_u32(c->out + 4, crc);
    tt_put_u32(c->out + 8, off);
    c->out_len = 12u + n;
    return TT_OK;
}

/* u32 round | u32 update crc | u8 accepted | 3 x u8 0  ->  u32 status | u32 residual CRC */
static int tt_cmd_update_ack(tt_proto *p, tt_call *c)
{
    uint32_t status = 0, rc32 = 0;
    int rc;
    if (p->m->update_ack == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n != 12) {
        c->detail = 12;
        return TT_ERR_LENGTH;
    }
    rc = p->m->update_ack(tt_get_u32(c->in), tt_get_u32(c->in + 4), c->in[8] != 0u, &status, &rc32);
    if (rc != 0) {
        return tt_hook_err(rc, &c->detail);
    }
    tt_put_u32(c->out, status);
    tt_put_u32(c->out + 4, rc32);
    c->out_len = 8;
    return TT_OK;
}

/* u32 mult | u8 shift | 3 x u8 0  ->  u32 step | u32 state hash (after the pull) */
static int tt_cmd_fed_prox(tt_proto *p, tt_call *c)
{
    int rc;
    if (p->m->fed_prox == NULL) {
        return TT_ERR_UNSUPPORTED;
    }
    if (c->n != 8) {
        c->detail = 8;
        return TT_ERR_LENGTH;
    }
    rc = p->m->fed_prox(tt_get_u32(c->in), c->in[4]);
    if (rc != 0) {
        return tt_hook_err(rc, &c->detail);
    }
    tt_put_state(p, c);
    return TT_OK;
}

typedef int (*tt_cmd_fn)(tt_proto *p, tt_call *c);

static tt_cmd_fn tt_cmd_lookup(uint32_t type)
{
    switch (type) {
    case TT_MSG_HELLO: return tt_cmd_hello;
    case TT_MSG_LOAD_STATUS: return tt_cmd_load_status;
    case TT_MSG_LOAD_PARAMS: return tt_cmd_load_params;
    case TT_MSG_LOAD_COMMIT: return tt_cmd_load_commit;
    case TT_MSG_TRAIN: return tt_cmd_train;
    case TT_MSG_TRAIN_BATCH: return tt_cmd_train_batch;
    case TT_MSG_PREDICT: return tt_cmd_predict;
    case TT_MSG_STATE_HASH: return tt_cmd_state_hash;
    case TT_MSG_GET_TENSOR: return tt_cmd_get_tensor;
    case TT_MSG_SET_SEED: return tt_cmd_set_seed;
    case TT_MSG_RESET: return tt_cmd_reset;
    case TT_MSG_ROUND_BEGIN: return tt_cmd_round_begin;
    case TT_MSG_GET_UPDATE: return tt_cmd_get_update;
    case TT_MSG_UPDATE_ACK: return tt_cmd_update_ack;
    case TT_MSG_FED_PROX: return tt_cmd_fed_prox;
    default: return NULL;
    }
}

static void tt_frame_process(tt_proto *p, uint32_t len)
{
    const uint8_t *f = p->rx;
    uint32_t crc, seq, type, plen, schema;
    tt_cmd_fn fn;
    tt_call c;
    int rc;

    if (len < TT_HDR_LEN + TT_CRC_LEN) {
        tt_reject(p, 0, 0, TT_ERR_FRAMING, len);
        return;
    }
    crc = tt_get_u32(f + len - TT_CRC_LEN);
    if (tt_crc32_update(0, f, len - TT_CRC_LEN) != crc) {
        tt_reject(p, 0, 0, TT_ERR_CRC, 0); /* nothing in it can be trusted, not even seq */
        return;
    }
    type = f[1];
    seq = tt_get_u16(f + 2);
    plen = tt_get_u16(f + 6);
    schema = tt_get_u32(f + 8);
    if (f[0] != TT_PROTO_VERSION) {
        tt_reject(p, seq, type, TT_ERR_VERSION, TT_PROTO_VERSION);
        return;
    }
    if (plen != len - TT_HDR_LEN - TT_CRC_LEN) {
        tt_reject(p, seq, type, TT_ERR_LENGTH, len - TT_HDR_LEN - TT_CRC_LEN);
        return;
    }
    fn = tt_cmd_lookup(type);
    if (fn == NULL) {
        tt_reject(p, seq, type, TT_ERR_UNKNOWN_CMD, type);
        return;
    }
    if (p->have_last && seq == p->last_seq && type == p->last_type && crc == p->last_crc &&
        type != TT_MSG_HELLO) {
        /* retransmission of the request we executed last: same answer, marked as a replay */
        p->tx[4] |= (uint8_t)TT_FLAG_REPLAY;
        tt_put_u32(p->tx + p->tx_len - TT_CRC_LEN,
                   tt_crc32_update(0, p->tx, p->tx_len - TT_CRC_LEN));
        tt_frame_send(p, p->tx, p->tx_len);
        return;
    }
    if (type != TT_MSG_HELLO && schema != 0 && schema != p->m->schema_hash) {
        tt_reject(p, seq, type, TT_ERR_SCHEMA, p->m->schema_hash);
        return;
    }
    c.in = f + TT_HDR_LEN;
    c.n = plen;
    c.out = p->tx + TT_HDR_LEN;
    c.out_len = 0;
    c.detail = 0;
    rc = fn(p, &c);
    if (rc == TT_OK) {
        p->tx_len = tt_frame_finish(p, p->tx, type | TT_MSG_REPLY, seq, 0, c.out_len);
    } else {
        p->tx_len = tt_error_build(p, p->tx, seq, type, (uint32_t)rc, c.detail);
    }
    p->have_last = 1;
    p->last_seq = (uint16_t)seq;
    p->last_type = (uint8_t)type;
    p->last_crc = crc;
    tt_frame_send(p, p->tx, p->tx_len);
}

void tt_proto_init(tt_proto *p, const tt_device_model *m, const tt_proto_io *io)
{
    memset(p, 0, sizeof *p);
    p->m = m;
    p->io = *io;
    tt_cobs_decoder_init(&p->dec, p->rx, sizeof p->rx);
}

void tt_proto_send_boot(tt_proto *p)
{
    tt_call c;
    uint32_t n;
    c.in = NULL;
    c.n = 0;
    c.out = p->tx + TT_HDR_LEN;
    (void)tt_cmd_hello(p, &c);
    n = tt_frame_finish(p, p->tx, TT_MSG_HELLO | TT_MSG_REPLY, 0,
                        TT_FLAG_UNSOLICITED | TT_FLAG_BOOT, c.out_len);
    p->have_last = 0;
    tt_frame_send(p, p->tx, n); /* its lead 0x00 resyncs the host's decoder */
}

void tt_proto_log(tt_proto *p, const char *text)
{
    uint32_t n = 0;
    while (n < TT_LOG_MAX && text[n] != '\0') {
        n++;
    }
    memcpy(p->aux + TT_HDR_LEN, text, n);
    tt_frame_send(p, p->aux, tt_frame_finish(p, p->aux, TT_MSG_LOG, 0, TT_FLAG_UNSOLICITED, n));
}

int tt_proto_feed(tt_proto *p, uint8_t byte)
{
    int r = tt_cobs_decode_byte(&p->dec, byte);
    if (r == TT_COBS_FRAME) {
        tt_frame_process(p, p->dec.len);
    } else if (r == TT_COBS_ERR_OVERFLOW) {
        tt_reject(p, 0, 0, TT_ERR_TOO_LONG, TT_FRAME_MAX);
    } else if (r == TT_COBS_ERR_TRUNCATED) {
        tt_reject(p, 0, 0, TT_ERR_FRAMING, 0);
    } else {
        return 0;
    }
    return 1;
}
