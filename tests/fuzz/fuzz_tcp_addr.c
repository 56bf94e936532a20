/* fuzz_tcp_addr.c - libFuzzer harness for the address records ranks publish
 * for the TCP mesh (kt__tcp_addr, through the store or, for a split, the
 * parent communicator's allgather), as kt__tcp_mesh reads them before it
 * connects anything (src/transport/tcp.c, included here to reach its static
 * functions): check_addrs, then the pairs' lane counts (plan_lanes).
 *
 * Input: byte 0: bits 0-1: ranks - 2 (2 to 5), bits 2-4: this rank (mod the
 * ranks); then the ranks' records, sizeof(kt__tcp_addr) bytes each (zeros
 * where the input ends), this rank's own replaced by a well-formed one
 * unless bit 5 is set.
 * Checks besides crashes and sanitizer reports: an accepted set has every
 * text ending inside its field, an IPv4 address inet_pton takes, ports
 * 1-65535, pids above 0, 1-16 lanes; a rejected one names the rank and the
 * field; every pair then has 0 lanes to itself, 1 to a rank with the same
 * host id, and 1 to KT_TCP_MAX_LANES otherwise. */
#include "../../src/transport/tcp.c"

#include <stdint.h>

#define FUZZ_NAME "fuzz_tcp_addr"
#include "fuzz_common.h"

static bool terminated(const char *s, size_t cap) { return memchr(s, '\0', cap) != NULL; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1 || size > 1 + 5 * sizeof(kt__tcp_addr)) return 0;
  const int n = (data[0] & 3) + 2, me = ((data[0] >> 2) & 7) % n;
  kt__tcp_addr all[5];
  memset(all, 0, sizeof all);
  memcpy(all, data + 1, size - 1);
  if (!(data[0] & 32)) {
    kt__tcp_addr *a = &all[me];
    memset(a, 0, sizeof *a);
    snprintf(a->ip, sizeof a->ip, "10.0.0.1");
    a->port = 4242;
    a->pid = 1;
    a->lanes = 2;
    snprintf(a->host, sizeof a->host, "me");
    snprintf(a->hostid, sizeof a->hostid, "me/boot");
  }
  kt__group c;
  memset(&c, 0, sizeof c);
  c.rank = me;
  c.size = n;
  c.abort_fd = -1;
  snprintf(c.prefix, sizeof c.prefix, "fuzz/tcp_addr");
  if (kt__tcp_create(&c, -1) != KT_SUCCESS) abort();
  kt__clear_error();
  kt_result r = check_addrs(&c, all);
  if (r != KT_SUCCESS) {
    check(r == KT_ERR_INVALID_ARGUMENT, "a malformed record is an invalid argument");
    check(strstr(kt_last_error(), "published a malformed address record (its ") != NULL, "a rejection names the field");
  } else {
    for (int j = 0; j < n; j++) {
      struct in_addr ip;
      check(terminated(all[j].ip, sizeof all[j].ip) && inet_pton(AF_INET, all[j].ip, &ip) == 1, "an IPv4 address");
      check(all[j].port >= 1 && all[j].port <= 65535, "a port in range");
      check(all[j].pid >= 1, "a pid");
      check(all[j].lanes >= 1 && all[j].lanes <= KT_TCP_MAX_LANES, "a connection count in range");
      check(terminated(all[j].host, sizeof all[j].host) && terminated(all[j].hostid, sizeof all[j].hostid),
            "host name and id end inside their fields");
    }
    plan_lanes(&c, all);
    for (int j = 0; j < n; j++) {
      int l = c.tcp->peers[j].nlanes;
      if (j == me) check(l == 0, "no connection to itself");
      else if (!strcmp(all[j].hostid, all[me].hostid)) check(l == 1, "one connection on a host");
      else check(l >= 1 && l <= KT_TCP_MAX_LANES && l <= all[j].lanes && l <= all[me].lanes, "lanes within both ends");
    }
  }
  kt__tcp_close(&c, false);
  return 0;
}
