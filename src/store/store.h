/* store.h - internal side of the rendezvous store: the handle behind the
 * public kt_store, helpers used by bootstrap, and the TCP wire protocol. */
#ifndef KT_STORE_H
#define KT_STORE_H

#include "common.h"

struct kt_store_s {
  kt_store_ops ops;
  void *ctx;
};

/* Bounds enforced by the server and checked by the client before sending. */
#define KT_STORE_MAX_KEY 4096
#define KT_STORE_MAX_VALUE (64u << 20)
#define KT_STORE_MAX_SECRET 256

/* get into a malloc'ed buffer (*value freed by the caller with free()). */
KT_INTERNAL kt_result kt__store_get_alloc(kt_store s, const char *key, void **value, size_t *len,
                                         int64_t timeout_ms);

/* Parse "host:port" (IPv4 name or address, or [v6]:port). host gets at most
 * hostcap bytes including NUL. */
KT_INTERNAL kt_result kt__parse_hostport(const char *addr, char *host, size_t hostcap, int *port);

/* A store served for clients that reach it as `host`: the address its server
 * listens on (host itself when it is a loopback name, else every address of
 * host's family), and the one its own host connects to (loopback: `host` may
 * not be routable from the host itself, e.g. behind NAT). */
KT_INTERNAL bool kt__is_loopback(const char *host);
KT_INTERNAL const char *kt__store_listen_host(const char *host);
KT_INTERNAL const char *kt__store_self_host(const char *host);

#endif /* KT_STORE_H */
