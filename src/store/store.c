/* store.c - the generic store handle: wraps a table of operations, checks the
 * arguments of every call before it reaches the table, plus the helpers that
 * bootstrap uses (get into a fresh buffer, "host:port" parsing). */
#include "store.h"

#include "proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* On error *store is unchanged and nothing is allocated. */
kt_result kt_store_create(const kt_store_ops *ops, void *ctx, kt_store *store) {
  if (!store) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_create: store (output) is NULL");
  if (!ops) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_create: ops table is NULL");
  struct kt_store_s *s = kt__calloc(1, sizeof *s); /* freed by kt_store_free */
  if (!s) return KT_ERR_NO_MEMORY;
  s->ops = *ops;
  s->ctx = ctx;
  *store = s;
  return KT_SUCCESS;
}

void kt_store_free(kt_store store) {
  if (!store) return;
  if (store->ops.destroy) store->ops.destroy(store->ctx);
  free(store);
}

/* Checks shared by every wrapper: the handle, the slot, the key. */
static kt_result check_store(kt_store s, const char *fn, bool has_slot, const char *slot_name) {
  if (!s) return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: store is NULL", fn);
  if (!has_slot)
    return kt__err(KT_ERR_UNSUPPORTED, "%s: this store has no '%s' operation (its ops table slot is NULL)",
                   fn, slot_name);
  return KT_SUCCESS;
}

static kt_result check_key(const char *fn, const char *key, size_t index) {
  if (!key) {
    if (index == (size_t)-1) return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: key is NULL", fn);
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: keys[%zu] is NULL", fn, index);
  }
  size_t n = strnlen(key, KT_STORE_MAX_KEY + 1);
  if (n > KT_STORE_MAX_KEY) {
    char which[32] = "key";
    if (index != (size_t)-1) snprintf(which, sizeof which, "keys[%zu]", index);
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "%s: %s " KT_KEYFMT " is longer than the store's limit of %d bytes", fn, which,
                   KT_KEYARG(key), KT_STORE_MAX_KEY);
  }
  return KT_SUCCESS;
}

static kt_result check_keys(const char *fn, const char *const *keys, size_t nkeys) {
  if (nkeys > 0 && !keys)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "%s: keys is NULL but nkeys is %zu", fn, nkeys);
  for (size_t i = 0; i < nkeys; i++) KT_CHECK(check_key(fn, keys[i], i));
  return KT_SUCCESS;
}

kt_result kt_store_set(kt_store s, const char *key, const void *value, size_t len) {
  KT_CHECK(check_store(s, "kt_store_set", s && s->ops.set, "set"));
  KT_CHECK(check_key("kt_store_set", key, (size_t)-1));
  if (!value && len > 0)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_set: value of key " KT_KEYFMT " is NULL but len is %zu",
                   KT_KEYARG(key), len);
  if (len > KT_STORE_MAX_VALUE)
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "kt_store_set: value of key " KT_KEYFMT " is %zu bytes; the store's limit is %u bytes",
                   KT_KEYARG(key), len, KT_STORE_MAX_VALUE);
  return s->ops.set(s->ctx, key, value ? value : "", len);
}

kt_result kt_store_get(kt_store s, const char *key, void *buf, size_t cap, size_t *len,
                       int64_t timeout_ms) {
  KT_CHECK(check_store(s, "kt_store_get", s && s->ops.get, "get"));
  KT_CHECK(check_key("kt_store_get", key, (size_t)-1));
  if (!buf && cap > 0)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_get: buffer for key " KT_KEYFMT " is NULL but cap is %zu",
                   KT_KEYARG(key), cap);
  if (!len)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_get: len (output) for key " KT_KEYFMT " is NULL",
                   KT_KEYARG(key));
  return s->ops.get(s->ctx, key, buf, cap, len, timeout_ms);
}

kt_result kt_store_add(kt_store s, const char *key, int64_t delta, int64_t *result) {
  KT_CHECK(check_store(s, "kt_store_add", s && s->ops.add, "add"));
  KT_CHECK(check_key("kt_store_add", key, (size_t)-1));
  int64_t ignored;
  return s->ops.add(s->ctx, key, delta, result ? result : &ignored);
}

kt_result kt_store_wait(kt_store s, const char *const *keys, size_t nkeys, int64_t timeout_ms) {
  KT_CHECK(check_store(s, "kt_store_wait", s && s->ops.wait, "wait"));
  KT_CHECK(check_keys("kt_store_wait", keys, nkeys));
  if (nkeys == 0) return KT_SUCCESS;
  return s->ops.wait(s->ctx, keys, nkeys, timeout_ms);
}

kt_result kt_store_check(kt_store s, const char *const *keys, size_t nkeys, int *ready) {
  KT_CHECK(check_store(s, "kt_store_check", s && s->ops.check, "check"));
  KT_CHECK(check_keys("kt_store_check", keys, nkeys));
  if (!ready) return kt__err(KT_ERR_INVALID_ARGUMENT, "kt_store_check: ready (output) is NULL");
  if (nkeys == 0) {
    *ready = 1;
    return KT_SUCCESS;
  }
  return s->ops.check(s->ctx, keys, nkeys, ready);
}

kt_result kt_store_delete(kt_store s, const char *key) {
  KT_CHECK(check_store(s, "kt_store_delete", s && s->ops.del, "del"));
  KT_CHECK(check_key("kt_store_delete", key, (size_t)-1));
  return s->ops.del(s->ctx, key);
}

/* A first guess that fits every bootstrap record; larger values cost one
 * more round trip. The value may change between tries, hence the loop. */
#define GET_ALLOC_FIRST 4096
#define GET_ALLOC_TRIES 8

kt_result kt__store_get_alloc(kt_store s, const char *key, void **value, size_t *len,
                              int64_t timeout_ms) {
  if (!value || !len)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt__store_get_alloc: value or len (output) is NULL");
  size_t cap = GET_ALLOC_FIRST;
  for (int attempt = 0; attempt < GET_ALLOC_TRIES; attempt++) {
    void *buf = kt__malloc(cap); /* handed to the caller, or freed below */
    if (!buf) return KT_ERR_NO_MEMORY;
    size_t n = 0;
    kt_result r = kt_store_get(s, key, buf, cap, &n, timeout_ms);
    if (r == KT_SUCCESS) {
      *value = buf;
      *len = n;
      return KT_SUCCESS;
    }
    free(buf);
    if (r != KT_ERR_TRUNCATED) return r;
    if (n <= cap) /* a store that reports TRUNCATED must say how much it needs */
      return kt__err(KT_ERR_INTERNAL,
                     "get of key " KT_KEYFMT ": store reported a truncated value of %zu bytes into %zu",
                     KT_KEYARG(key), n, cap);
    cap = n;
  }
  return kt__err(KT_ERR_STORE, "get of key " KT_KEYFMT ": its value kept growing over %d tries",
                 KT_KEYARG(key), GET_ALLOC_TRIES);
}

kt_result kt__parse_hostport(const char *addr, char *host, size_t hostcap, int *port) {
  if (!addr || !host || !port || hostcap == 0)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "kt__parse_hostport: NULL argument");
  const char *hbeg, *hend, *pstr;
  if (addr[0] == '[') {
    hbeg = addr + 1;
    hend = strchr(hbeg, ']');
    if (!hend || hend[1] != ':')
      return kt__err(KT_ERR_INVALID_ARGUMENT,
                     "store address '%s': expected [ipv6-address]:port", addr);
    pstr = hend + 2;
  } else {
    hbeg = addr;
    hend = strrchr(addr, ':');
    if (!hend)
      return kt__err(KT_ERR_INVALID_ARGUMENT, "store address '%s': expected host:port", addr);
    if (memchr(addr, ':', (size_t)(hend - addr)))
      return kt__err(KT_ERR_INVALID_ARGUMENT,
                     "store address '%s': an IPv6 address must be written [address]:port", addr);
    pstr = hend + 1;
  }
  size_t hlen = (size_t)(hend - hbeg);
  if (hlen == 0) return kt__err(KT_ERR_INVALID_ARGUMENT, "store address '%s': empty host", addr);
  if (hlen >= hostcap)
    return kt__err(KT_ERR_INVALID_ARGUMENT, "store address '%s': host is longer than %zu bytes", addr,
                   hostcap - 1);
  long p = 0;
  const char *c = pstr;
  if (*c == '\0')
    return kt__err(KT_ERR_INVALID_ARGUMENT, "store address '%s': missing port after ':'", addr);
  for (; *c; c++) {
    if (*c < '0' || *c > '9' || p > 65535)
      return kt__err(KT_ERR_INVALID_ARGUMENT,
                     "store address '%s': port '%s' is not a number in 1..65535", addr, pstr);
    p = p * 10 + (*c - '0');
  }
  if (p < 1 || p > 65535)
    return kt__err(KT_ERR_INVALID_ARGUMENT,
                   "store address '%s': port '%s' is not a number in 1..65535", addr, pstr);
  memcpy(host, hbeg, hlen);
  host[hlen] = '\0';
  *port = (int)p;
  return KT_SUCCESS;
}

bool kt__is_loopback(const char *host) {
  return !strcmp(host, "localhost") || !strncmp(host, "127.", 4) || !strcmp(host, "::1");
}

const char *kt__store_listen_host(const char *host) {
  return kt__is_loopback(host) ? host : strchr(host, ':') ? "::" : "0.0.0.0";
}

const char *kt__store_self_host(const char *host) {
  return kt__is_loopback(host) ? host : strchr(host, ':') ? "::1" : "127.0.0.1";
}
