/* proto.h - wire protocol of the KaiTian TCP store, shared by the server, the
 * client and the tests that forge frames.
 *
 * Every message, request or reply, is one frame: a fixed 28-byte header in
 * network byte order, then a key section of klen bytes, then a value of vlen
 * bytes.
 *
 *   off size field
 *     0    4 magic    KT_PROTO_MAGIC ("KTS1")
 *     4    1 version  KT_PROTO_VERSION
 *     5    1 op       request opcode, or KT_OP_REPLY
 *     6    2 status   replies: KT_PST_*; requests: 0
 *     8    4 nkeys    number of keys in the key section
 *    12    4 klen     bytes of the key section: nkeys keys, each NUL-terminated
 *    16    4 vlen     bytes of the value
 *    20    8 arg      per op: timeout_ms (GET, WAIT), delta (ADD request),
 *                     new value (ADD reply), ready flag (CHECK reply)
 *
 * A connection starts with HELLO (value = job secret); the server answers OK,
 * or DENIED and closes. Then the client sends one request at a time and reads
 * its reply. A GET or WAIT that cannot be answered is parked by the server and
 * answered when its keys appear, or with KT_PST_TIMEOUT when its timeout_ms
 * (measured by the server from the request's arrival) runs out; a negative
 * timeout_ms parks without a server-side deadline. Reply values: GET the
 * value; TIMEOUT the first key still missing; INVALID an error message. ADD
 * keeps its counter as decimal text (as torch's stores do), so a GET of it
 * reads "42". A connection that has not said HELLO within
 * KAITIAN_CONNECT_TIMEOUT is dropped.
 * Anything malformed closes the connection without a reply. */
#ifndef KT_STORE_PROTO_H
#define KT_STORE_PROTO_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

#define KT_PROTO_MAGIC 0x4b545331u /* "KTS1" */
#define KT_PROTO_VERSION 1
#define KT_PROTO_HDR_SIZE 28

/* Bounds beyond those of store.h: keys per WAIT/CHECK, bytes of a key
 * section, bytes of a reply's error message. */
#define KT_PROTO_MAX_KEYS 65536u
#define KT_PROTO_MAX_KEYBYTES (8u << 20)
#define KT_PROTO_MAX_MSG 1024u

enum kt_proto_op {
  KT_OP_HELLO = 1,
  KT_OP_SET = 2,
  KT_OP_GET = 3,
  KT_OP_ADD = 4,
  KT_OP_WAIT = 5,
  KT_OP_CHECK = 6,
  KT_OP_DEL = 7,
  KT_OP_REPLY = 0x80,
};

enum kt_proto_status {
  KT_PST_OK = 0,
  KT_PST_TIMEOUT = 1, /* value: the first key still missing */
  KT_PST_DENIED = 2,  /* wrong job secret; the server closes after this */
  KT_PST_INVALID = 3, /* request refused (e.g. ADD on a non-integer); value: message */
};

typedef struct kt_proto_hdr {
  uint32_t magic;
  uint8_t version;
  uint8_t op;
  uint16_t status;
  uint32_t nkeys;
  uint32_t klen;
  uint32_t vlen;
  int64_t arg;
} kt_proto_hdr;

static inline void kt_proto_encode(const kt_proto_hdr *h, unsigned char out[KT_PROTO_HDR_SIZE]) {
  uint32_t u32;
  uint16_t u16;
  uint64_t u64;
  u32 = htobe32(h->magic);
  memcpy(out + 0, &u32, 4);
  out[4] = h->version;
  out[5] = h->op;
  u16 = htobe16(h->status);
  memcpy(out + 6, &u16, 2);
  u32 = htobe32(h->nkeys);
  memcpy(out + 8, &u32, 4);
  u32 = htobe32(h->klen);
  memcpy(out + 12, &u32, 4);
  u32 = htobe32(h->vlen);
  memcpy(out + 16, &u32, 4);
  u64 = htobe64((uint64_t)h->arg);
  memcpy(out + 20, &u64, 8);
}

static inline void kt_proto_decode(const unsigned char in[KT_PROTO_HDR_SIZE], kt_proto_hdr *h) {
  uint32_t u32;
  uint16_t u16;
  uint64_t u64;
  memcpy(&u32, in + 0, 4);
  h->magic = be32toh(u32);
  h->version = in[4];
  h->op = in[5];
  memcpy(&u16, in + 6, 2);
  h->status = be16toh(u16);
  memcpy(&u32, in + 8, 4);
  h->nkeys = be32toh(u32);
  memcpy(&u32, in + 12, 4);
  h->klen = be32toh(u32);
  memcpy(&u32, in + 16, 4);
  h->vlen = be32toh(u32);
  memcpy(&u64, in + 20, 8);
  h->arg = (int64_t)be64toh(u64);
}

static inline const char *kt_proto_op_name(unsigned op) {
  switch (op) {
    case KT_OP_HELLO: return "HELLO";
    case KT_OP_SET: return "SET";
    case KT_OP_GET: return "GET";
    case KT_OP_ADD: return "ADD";
    case KT_OP_WAIT: return "WAIT";
    case KT_OP_CHECK: return "CHECK";
    case KT_OP_DEL: return "DEL";
    case KT_OP_REPLY: return "REPLY";
    default: return "unknown";
  }
}

/* Keys in messages: at most 64 characters, then "...". Use as
 * printf("key " KT_KEYFMT, KT_KEYARG(key)). */
#define KT_KEYFMT "'%.*s%s'"
#define KT_KEYARG(k) (int)(strlen(k) > 64 ? 64 : strlen(k)), (k), (strlen(k) > 64 ? "..." : "")

#endif /* KT_STORE_PROTO_H */
