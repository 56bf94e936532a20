/* fuzz_split.c - libFuzzer harness for what kt_comm_split's exchange gives a
 * rank (kt__split_rec: color, key, rank; src/core/comm.c,
 * kt__split_members), as it picks the new communicator's members and its
 * own rank among them. The records' mesh addresses are fuzz_tcp_addr's.
 *
 * Input: byte 0: bits 0-2: ranks - 1 (1 to 8), bits 3-5: this rank (mod the
 * ranks); byte 1: this rank's color, as an index into the colors below;
 * then each rank's record, 12 bytes (color, key, rank, little-endian 32-bit),
 * zeros where the input ends. This rank's own record is made well-formed
 * (its color, its rank, the key the input gave) unless bit 6 of byte 0 is
 * set; byte 0's bit 7 makes every record's color one of -1, 0, 1, 2 and
 * every rank field its place (well-formed exchanges, to reach the sort).
 * Checks besides crashes and sanitizer reports: an accepted exchange had
 * every record at its rank's place with a color >= 0 or KT_SPLIT_NOCOLOR,
 * and gives exactly the records of this rank's color, each rank once,
 * ordered by key then rank, this rank at the place it returns; a rejected
 * one says which rank's record and what was wrong with it. */
#include "comm.h"

#include <stdint.h>
#include <string.h>

#define FUZZ_NAME "fuzz_split"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2 || size > 2 + 8 * 12) return 0;
  const int n = (data[0] & 7) + 1, me = ((data[0] >> 3) & 7) % n;
  const bool own_raw = data[0] & 64, tame = data[0] & 128;
  static const int32_t colors[4] = {KT_SPLIT_NOCOLOR, 0, 1, 2};
  const int32_t color = colors[data[1] % 4];
  if (color == KT_SPLIT_NOCOLOR) return 0; /* a rank without a color reads no record */
  uint8_t raw[8 * 12];
  memset(raw, 0, sizeof raw);
  memcpy(raw, data + 2, size - 2);
  kt__split_rec recs[8], orig[8];
  memset(recs, 0, sizeof recs);
  for (int i = 0; i < n; i++) {
    recs[i].color = (int32_t)get_le(raw + 12 * i, 4);
    recs[i].key = (int32_t)get_le(raw + 12 * i + 4, 4);
    recs[i].rank = (int32_t)get_le(raw + 12 * i + 8, 4);
    recs[i].addr.port = 1000 + i; /* which record it is, after the sort */
    if (tame) {
      recs[i].color = colors[(uint32_t)recs[i].color % 4];
      recs[i].rank = i;
    }
  }
  if (!own_raw) {
    recs[me].color = color;
    recs[me].rank = me;
  }
  memcpy(orig, recs, sizeof orig);

  kt__clear_error();
  int m = -1, newrank = -1;
  kt_result r = kt__split_members(recs, n, me, color, &m, &newrank);
  bool well_formed = true;
  for (int i = 0; i < n; i++)
    well_formed = well_formed && orig[i].rank == i && (orig[i].color >= 0 || orig[i].color == KT_SPLIT_NOCOLOR);
  if (r != KT_SUCCESS) {
    const char *e = kt_last_error();
    check(e && strstr(e, "rank "), "a rejection names a rank");
    check(r == KT_ERR_MISMATCH ? !well_formed : (well_formed && orig[me].color != color),
          "rejected only a record not its rank's own (or this rank not of its color)");
    return 0;
  }
  check(well_formed, "every accepted record was at its rank's place, with a color a rank can pass");
  int want = 0;
  for (int i = 0; i < n; i++) want += orig[i].color == color;
  check(m == want, "the members are exactly the records of this rank's color");
  check(newrank >= 0 && newrank < m && recs[newrank].rank == me, "this rank at the place returned");
  bool seen[8] = {false};
  for (int i = 0; i < m; i++) {
    const kt__split_rec *x = &recs[i];
    check(x->rank >= 0 && x->rank < n && !seen[x->rank], "each member once, a rank of the parent");
    seen[x->rank] = true;
    check(x->color == color && x->key == orig[x->rank].key && x->addr.port == 1000 + x->rank,
          "a member's record is its rank's, whole");
    if (i > 0)
      check(recs[i - 1].key < x->key || (recs[i - 1].key == x->key && recs[i - 1].rank < x->rank),
            "ordered by key, then rank");
  }
  return 0;
}
