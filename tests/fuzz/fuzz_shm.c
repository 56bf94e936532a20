/* fuzz_shm.c - libFuzzer harness for what the shared-memory transport
 * believes of what its peers wrote into the segment (src/transport/shm.c,
 * included here to reach its static functions): the segment header the
 * creator publishes (layout_ok), a point-to-point message's header and
 * payload in a peer's ring with the peer's ring counter (kt__shm_p2p, the
 * receive side of src/coll/p2p_shm.c), and a peer's failure record and op
 * signatures (check_failures, check_sigs through kt__shm_wait).
 *
 * The segment is ordinary memory here (no /dev/shm), laid out as for two
 * ranks with 4 KiB regions and rings; this process is rank 0.
 * Input: the first byte picks the target, the rest is its data:
 *   0: a header (ranks, regions, ring bytes, total bytes) for n ranks and a
 *      file of a given size, as a rank that did not create it checks it;
 *   1: a receive from rank 1 (tag, length, dtype, where the ring's counters
 *      stand, how many bytes rank 1 claims to have written), then the ring's
 *      bytes;
 *   2: rank 1's slot and the header's failure record, then a wait for rank
 *      1 to reach a step (the deadline already past: a wait that is not
 *      satisfied ends at once with a timeout).
 * Checks besides crashes and sanitizer reports: an accepted header puts
 * every region and every ring, none of them empty, inside the file; a
 * receive that succeeds took a header that matches the one expected and
 * exactly the payload's bytes after it, never more than the peer published,
 * and moved the ring's tail to just past them; every error is a known
 * result code with a message. */
#include "../../src/transport/shm.c"

#include <stdint.h>

#define N 2
#define REGION 4096
#define P2P 4096

#define FUZZ_NAME "fuzz_shm"
#include "fuzz_common.h"
#include "fuzz_segment.h"

static void layout(const uint8_t *p, size_t n) {
  uint8_t b[33] = {0};
  memcpy(b, p, KT_MIN(n, sizeof b));
  int ranks = b[0] % 64 + 1;
  shm_hdr h;
  memset(&h, 0, sizeof h);
  h.nlocal = (uint32_t)get_le(b + 1, 4);
  h.region = get_le(b + 5, 8);
  h.p2p = get_le(b + 13, 8);
  h.bytes = get_le(b + 21, 8);
  size_t bytes = (size_t)get_le(b + 29, 4) * 4096 + data_offset(ranks); /* the file is at least this */
  if (b[0] & 0x80) { /* the header is the creator's for that file */
    h.nlocal = (uint32_t)ranks;
    h.bytes = bytes;
  }
  if (!layout_ok(&h, ranks, bytes)) return;
  /* Regions and rings of 0 bytes both: the creator found no room in /dev/shm
   * (the communicator runs over TCP); the file is then the header, slots
   * and ring heads only. */
  check((h.region > 0 && h.p2p > 0) || (h.region == 0 && h.p2p == 0 && bytes == data_offset(ranks)),
        "no empty region or ring, unless both are (no room: TCP)");
  unsigned __int128 end = (unsigned __int128)data_offset(ranks) + (unsigned __int128)ranks * 4 * h.region;
  end = (end + 4095) / 4096 * 4096 + (unsigned __int128)ranks * ranks * h.p2p;
  check(end == bytes, "every region and ring inside the file, which they fill");
}

/* The fake communicator: rank 0 of N over a segment in memory. */
static kt__group comm;
static kt__shm shm;
static int32_t pids[N];
static void *base;
static size_t seg_bytes;

static void setup(const kt__op *op) {
  if (!base) {
    seg_bytes = segment_bytes(N, REGION, P2P);
    base = aligned_alloc(4096, seg_bytes);
    if (!base) abort();
  }
  fuzz_segment(&shm, base, seg_bytes, N, REGION, P2P);
  memset(&comm, 0, sizeof comm);
  comm.rank = 0;
  comm.size = N;
  comm.timeout_ms = 1000;
  comm.peer_pid = pids;
  comm.shm = &shm;
  comm.abort_fd = -1;
  kt__op_sig(op, N, &shm.cur);
}

static void known_error(kt_result r) {
  check(r > KT_SUCCESS && r <= KT_ERR_INTERNAL, "a known result code");
  check(kt_last_error()[0] != '\0', "an error has a message");
}

static void receive(const uint8_t *p, size_t n) {
  uint8_t b[19] = {0};
  memcpy(b, p, KT_MIN(n, sizeof b));
  kt__op op = {.coll = KT_COLL_RECV, .dtype = (kt_dtype)(b[0] % KT_NUM_DTYPES), .root = 1, .seq = 0};
  uint32_t tag = (uint32_t)get_le(b + 1, 4);
  size_t rlen = get_le(b + 5, 2) % (2 * P2P);
  uint64_t tail = get_le(b + 7, 8);                /* where the ring stands (bytes ever consumed) */
  uint64_t head = tail + get_le(b + 15, 4);        /* what rank 1 claims it wrote */
  setup(&op);
  char *ring = ring_of(&shm, 1, 0);
  const uint8_t *bytes = p + KT_MIN(n, sizeof b);
  size_t nb = n - KT_MIN(n, sizeof b);
  for (size_t i = 0; i < KT_MIN(nb, (size_t)P2P); i++) ring[(tail + i) % P2P] = (char)bytes[i];
  chan *ch = chan_of(&shm, 1, 0);
  atomic_store(&ch->head, head);
  atomic_store(&ch->tail, tail);
  char *rbuf = malloc(rlen ? rlen : 1);
  if (!rbuf) abort();
  kt__exec ex = {.group = &comm, .op = &op, .deadline_ns = kt__now_ns() - 1};
  kt__clear_error();
  kt_result r = kt__shm_p2p(&ex, -1, NULL, 0, 1, rbuf, rlen, tag);
  if (r != KT_SUCCESS) {
    known_error(r);
  } else {
    check(head - tail >= P2P_HDR_BYTES + rlen, "no byte read beyond what the peer published");
    check(atomic_load(&ch->tail) == tail + P2P_HDR_BYTES + rlen, "the tail just past the message");
    unsigned char h[P2P_HDR_BYTES];
    for (size_t i = 0; i < P2P_HDR_BYTES; i++) h[i] = (unsigned char)ring[(tail + i) % P2P];
    uint32_t magic, htag, dtype;
    uint64_t len;
    memcpy(&magic, h, 4);
    memcpy(&htag, h + 4, 4);
    memcpy(&len, h + 8, 8);
    memcpy(&dtype, h + 16, 4);
    check(magic == P2P_MAGIC && htag == tag && len == rlen && dtype == (uint32_t)op.dtype,
          "the header is the one expected");
    for (size_t i = 0; i < rlen; i++)
      check(rbuf[i] == ring[(tail + P2P_HDR_BYTES + i) % P2P], "the payload is the ring's bytes after it");
  }
  free(rbuf);
}

static void failures(const uint8_t *p, size_t n) {
  uint8_t b[16] = {0};
  memcpy(b, p, KT_MIN(n, sizeof b));
  kt__op op = {.coll = (kt__coll)(b[0] % KT_COLL_SPLIT), .dtype = KT_FLOAT32, .op = KT_SUM, .count = b[1],
               .seq = 7, .root = b[2] % N};
  size_t counts[N] = {b[1], 0};
  op.counts = counts;
  setup(&op);
  shm_slot *peer = slot_at(base, 1);
  atomic_store(&peer->step, get_le(b + 3, 1));
  atomic_store(&shm.hdr->failed, (int32_t)get_le(b + 4, 4));
  atomic_store(&shm.hdr->failed_rank, (int32_t)get_le(b + 8, 4));
  const uint8_t *rest = p + KT_MIN(n, sizeof b);
  size_t nr = n - KT_MIN(n, sizeof b);
  /* Then rank 1's signatures, then the failure text (not necessarily ended). */
  size_t k = KT_MIN(nr, sizeof peer->sigs);
  memcpy(peer->sigs, rest, k);
  memcpy(shm.hdr->failed_msg, rest + k, KT_MIN(nr - k, sizeof shm.hdr->failed_msg));
  shm.par = b[12] & 1;
  kt__exec ex = {.group = &comm, .op = &op, .deadline_ns = kt__now_ns() - 1};
  kt__clear_error();
  kt_result r = kt__shm_wait(&ex, b[13] & 1 ? 1 : -1, get_le(b + 14, 1));
  if (r != KT_SUCCESS) known_error(r);
  check(strlen(kt_last_error()) < 1024, "the message within its buffer");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 8192) return 0;
  switch (data[0] % 3) {
    case 0: layout(data + 1, size - 1); break;
    case 1: receive(data + 1, size - 1); break;
    default: failures(data + 1, size - 1);
  }
  return 0;
}
